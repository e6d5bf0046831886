#include "sluice/audit.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/grpc_deadline.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice {
namespace {

// The most samples one Audit call returns (AuditRequest.count).
constexpr int64_t kPage = 10000;

void SetDeadline(grpc::ClientContext& ctx, absl::Duration timeout) {
  ctx.set_deadline(client_internal::DeadlineAfter(timeout));
}

// The calls Audit and Replay make to the coordinator: a status names a
// TLS mismatch when the coordinator speaks the other transport.
class CoordinatorCalls {
 public:
  CoordinatorCalls(const std::string& address,
                   const std::optional<ClientTls>& tls,
                   absl::string_view tls_field, absl::Duration timeout)
      : address_(address),
        tls_(tls),
        tls_field_(tls_field),
        timeout_(timeout),
        credentials_(client_internal::ChannelCredentials(tls)),
        stub_(v1::Coordinator::NewStub(
            CoordinatorChannel(address, credentials_))) {}

  const std::shared_ptr<grpc::ChannelCredentials>& credentials() const {
    return credentials_;
  }

  absl::StatusOr<v1::Job> GetJob(const std::string& name) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout_);
    v1::GetJobRequest request;
    request.set_name(name);
    v1::Job job;
    RETURN_IF_ERROR(Explain(stub_->GetJob(&ctx, request, &job)));
    return job;
  }

  absl::StatusOr<v1::AuditResponse> Audit(const v1::AuditRequest& request) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout_);
    v1::AuditResponse page;
    RETURN_IF_ERROR(Explain(stub_->Audit(&ctx, request, &page)));
    return page;
  }

 private:
  absl::Status Explain(const grpc::Status& s) const {
    return client_internal::ExplainUnavailable(FromGrpcStatus(s), address_,
                                               tls_, tls_field_);
  }

  std::string address_;
  std::optional<ClientTls> tls_;
  std::string tls_field_;
  absl::Duration timeout_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// The job's live data servers in the order to ask them: one that did not
// answer (UNAVAILABLE, DEADLINE_EXCEEDED: down, or hung) goes last, so a
// hung server costs an audit one timeout, not one per shard and page.
class DataServerOrder {
 public:
  explicit DataServerOrder(std::vector<std::string> addresses)
      : addresses_(std::move(addresses)) {}
  // A copy: Failed may reorder while a caller walks it.
  std::vector<std::string> Now() const { return addresses_; }
  void Failed(const std::string& address) {
    auto it = std::find(addresses_.begin(), addresses_.end(), address);
    if (it == addresses_.end()) return;
    std::rotate(it, it + 1, addresses_.end());
  }
  // Whether `status` says the server did not answer (another may).
  static bool NoAnswer(const absl::Status& status) {
    return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status);
  }

 private:
  std::vector<std::string> addresses_;
};

// Sample keys per shard URL, read once per shard from the first of the
// job's live data servers that indexes it.
class KeyBook {
 public:
  KeyBook(DataServerOrder* data_servers,
          std::shared_ptr<grpc::ChannelCredentials> credentials,
          absl::Duration timeout)
      : data_servers_(data_servers),
        credentials_(std::move(credentials)),
        timeout_(timeout) {}

  std::string Key(const std::string& url, int64_t index, std::string* why) {
    auto it = keys_.find(url);
    if (it == keys_.end()) it = keys_.emplace(url, Look(url, why)).first;
    const std::vector<std::string>& keys = it->second;
    return index >= 0 && index < static_cast<int64_t>(keys.size())
               ? keys[index]
               : std::string();
  }

 private:
  std::vector<std::string> Look(const std::string& url, std::string* why) {
    absl::Status last =
        absl::UnavailableError("no data server of the job is live");
    for (const std::string& address : data_servers_->Now()) {
      auto stub = v1::DataServer::NewStub(
          grpc::CreateChannel(GrpcTarget(address), credentials_));
      grpc::ClientContext ctx;
      SetDeadline(ctx, timeout_);
      v1::IndexShardRequest request;
      request.set_url(url);
      request.set_include_samples(true);
      v1::ShardIndex index;
      last = FromGrpcStatus(stub->IndexShard(&ctx, request, &index));
      if (last.ok()) return {index.keys().begin(), index.keys().end()};
      if (DataServerOrder::NoAnswer(last)) data_servers_->Failed(address);
    }
    if (why->empty()) {
      *why = absl::StrCat("indexing ", url, " failed: ", last.message());
    }
    return {};
  }

  DataServerOrder* data_servers_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  absl::Duration timeout_;
  std::map<std::string, std::vector<std::string>> keys_;
};

// The most replay leases one ReplayDraws call carries: a call reads each
// sample's header from its shard, well within one call's timeout.
constexpr int kDrawsPerCall = 1000;

// Each sample's draws of an audit page (with its replay leases), from the
// first of `order` that answers.
absl::StatusOr<std::vector<v1::SampleDraws>> PlanDraws(
    DataServerOrder& order,
    const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    absl::Duration timeout, const v1::DecodeSpec& decode,
    const std::vector<std::string>& fields, const v1::AuditResponse& page) {
  std::vector<v1::SampleDraws> out;
  out.reserve(page.samples_size());
  absl::Status last = absl::UnavailableError(
      "no data server of the job is live to plan the draws");
  const std::vector<std::string> data_servers = order.Now();
  size_t server = 0;
  while (out.size() < static_cast<size_t>(page.samples_size())) {
    if (server == data_servers.size()) return last;
    v1::ReplayDrawsRequest request;
    *request.mutable_decode() = decode;
    for (const std::string& f : fields) request.add_fields(f);
    for (int i = static_cast<int>(out.size());
         i < page.samples_size() && request.leases_size() < kDrawsPerCall;
         ++i) {
      *request.add_leases() = page.samples(i).replay_lease();
    }
    const std::string& address = data_servers[server];
    auto stub = v1::DataServer::NewStub(
        grpc::CreateChannel(GrpcTarget(address), credentials));
    grpc::ClientContext ctx;
    SetDeadline(ctx, timeout);
    v1::ReplayDrawsResponse response;
    last = FromGrpcStatus(stub->ReplayDraws(&ctx, request, &response));
    if (last.ok() && response.draws_size() != request.leases_size()) {
      last = absl::InternalError(
          absl::StrCat("answered ", response.draws_size(), " draws for ",
                       request.leases_size(), " leases"));
    }
    if (!last.ok()) {
      last = absl::Status(last.code(), absl::StrCat("data server ", address,
                                                    ": ", last.message()));
      if (!DataServerOrder::NoAnswer(last)) return last;
      order.Failed(address);
      ++server;  // the next one plans the rest
      continue;
    }
    for (v1::SampleDraws& d : *response.mutable_draws())
      out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

absl::StatusOr<AuditResult> Audit(
    const AuditOptions& options,
    const std::function<void(const AuditedSample&)>& each) {
  if (options.coordinator.empty() || options.job.empty()) {
    return absl::InvalidArgumentError(
        "AuditOptions.coordinator and .job are required");
  }
  if (options.from < 0 || options.count < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AuditOptions.from=", options.from,
        " must be >= 0 and .count=", options.count, " >= -1 (-1: all)"));
  }
  if (options.step >= 0) {
    if (options.batch_size <= 0 || options.num_workers < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AuditOptions.step=", options.step, " needs .batch_size > 0 (it is ",
          options.batch_size, ") and .num_workers >= 0 (it is ",
          options.num_workers, ")"));
    }
    const int64_t workers = std::max<int64_t>(options.num_workers, 1);
    AuditOptions batch = options;
    batch.step = -1;
    batch.worker = static_cast<int32_t>(options.step % workers);
    batch.from = options.step / workers * options.batch_size;
    batch.count = options.batch_size;
    return Audit(batch, each);
  }
  RETURN_IF_ERROR(
      client_internal::CheckClientTls(options.tls, "AuditOptions.tls"));
  CoordinatorCalls coordinator(options.coordinator, options.tls,
                               "AuditOptions.tls", options.timeout);

  AuditResult result;
  std::vector<std::string> data_servers;
  if (options.keys || options.decode.has_value()) {
    ASSIGN_OR_RETURN(v1::Job job, coordinator.GetJob(options.job));
    data_servers.assign(job.status().live_data_servers().begin(),
                        job.status().live_data_servers().end());
  }
  if (!options.keys) result.keys_missing = "AuditOptions.keys is false";
  DataServerOrder order(std::move(data_servers));
  KeyBook keys(&order, coordinator.credentials(), options.timeout);

  int64_t position = options.from;
  int64_t left = options.count;  // -1: all
  while (left != 0) {
    v1::AuditRequest request;
    request.set_job(options.job);
    request.set_epoch(options.epoch);
    request.set_rank(options.rank);
    request.set_worker(options.worker);
    request.set_start(position);
    request.set_count(left < 0 ? kPage : std::min(left, kPage));
    request.set_rolled_back(options.rolled_back);
    request.set_replay_leases(options.decode.has_value());
    ASSIGN_OR_RETURN(v1::AuditResponse page, coordinator.Audit(request));
    std::vector<v1::SampleDraws> draws;
    if (options.decode.has_value()) {
      ASSIGN_OR_RETURN(
          draws, PlanDraws(order, coordinator.credentials(), options.timeout,
                           *options.decode, options.fields, page));
    }
    result.total = page.total();
    result.workers_per_rank = page.workers_per_rank();
    result.epochs_kept.assign(page.epochs_kept().begin(),
                              page.epochs_kept().end());
    for (int i = 0; i < page.samples_size(); ++i) {
      const v1::AuditedSample& s = page.samples(i);
      AuditedSample out;
      out.position = s.position();
      if (options.keys) {
        out.key = keys.Key(s.shard_url(), s.index(), &result.keys_missing);
      }
      out.shard_index = s.shard_index();
      out.shard_url = s.shard_url();
      out.index = s.index();
      out.source = s.source();
      out.unit = s.sequence();
      out.unit_kind = s.unit_kind();
      out.reread = s.reread();
      if (!draws.empty()) out.draws = std::move(draws[i]);
      if (each) {
        each(out);
      } else {
        result.samples.push_back(std::move(out));
      }
    }
    if (page.samples_size() == 0) break;
    position += page.samples_size();
    if (left > 0) left -= page.samples_size();
  }
  return result;
}

absl::StatusOr<AuditResult> Audit(const AuditOptions& options) {
  return Audit(options, nullptr);
}

namespace {

AuditedSample FromProto(const v1::AuditedSample& s) {
  AuditedSample out;
  out.position = s.position();
  out.shard_index = s.shard_index();
  out.shard_url = s.shard_url();
  out.index = s.index();
  out.source = s.source();
  out.unit = s.sequence();
  out.unit_kind = s.unit_kind();
  out.reread = s.reread();
  return out;
}

// The reader and position of the sample with `key` in the epoch.
absl::Status FindKey(const ReplayOptions& options, const v1::Job& job,
                     ReplayResult* result) {
  AuditOptions audit;
  audit.coordinator = options.coordinator;
  audit.job = options.job;
  audit.epoch = options.epoch;
  audit.tls = options.tls;
  audit.timeout = options.timeout;
  const int32_t ranks = std::max(job.spec().world_size(), 1);
  int32_t workers = 1;
  std::string missing;
  for (int32_t rank = 0; rank < ranks; ++rank) {
    for (int32_t worker = 0; worker < workers; ++worker) {
      audit.rank = rank;
      audit.worker = worker;
      bool found = false;
      absl::StatusOr<AuditResult> r = Audit(audit, [&](const AuditedSample& s) {
        if (!found && s.key == options.key) {
          found = true;
          result->audited = s;
        }
      });
      if (!r.ok()) return r.status();
      workers = r->workers_per_rank;
      if (missing.empty()) missing = r->keys_missing;
      if (found) {
        result->rank = rank;
        result->worker = worker;
        return absl::OkStatus();
      }
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "no reader of job ", options.job, " took a sample with key \"",
      options.key, "\" in epoch ", options.epoch,
      missing.empty() ? "" : absl::StrCat(" (keys unknown: ", missing, ")")));
}

}  // namespace

absl::StatusOr<ReplayResult> Replay(const ReplayOptions& options) {
  if (options.coordinator.empty() || options.job.empty()) {
    return absl::InvalidArgumentError(
        "ReplayOptions.coordinator and .job are required");
  }
  if ((options.position < 0) == options.key.empty()) {
    return absl::InvalidArgumentError(
        "ReplayOptions: give either .position (with .rank and .worker) or "
        ".key");
  }
  RETURN_IF_ERROR(
      client_internal::CheckClientTls(options.tls, "ReplayOptions.tls"));
  CoordinatorCalls coordinator(options.coordinator, options.tls,
                               "ReplayOptions.tls", options.timeout);
  ASSIGN_OR_RETURN(v1::Job job, coordinator.GetJob(options.job));
  ReplayResult result;
  int64_t position = options.position;
  if (!options.key.empty()) {
    RETURN_IF_ERROR(FindKey(options, job, &result));
    position = result.audited.position;
  } else {
    result.rank = options.rank;
    result.worker = options.worker;
  }
  // The sample's replay lease.
  v1::AuditRequest request;
  request.set_job(options.job);
  request.set_epoch(options.epoch);
  request.set_rank(result.rank);
  request.set_worker(result.worker);
  request.set_start(position);
  request.set_count(1);
  request.set_replay_leases(true);
  ASSIGN_OR_RETURN(v1::AuditResponse page, coordinator.Audit(request));
  if (page.samples_size() != 1) {
    return absl::OutOfRangeError(absl::StrCat(
        "position ", position, " of job ", options.job, " epoch ",
        options.epoch, " rank ", result.rank, " worker ", result.worker,
        ": the reader acknowledged ", page.total(), " samples"));
  }
  const std::string key = result.audited.key;
  result.audited = FromProto(page.samples(0));
  result.audited.key = key;

  std::vector<std::string> servers;
  if (!options.data_server.empty()) {
    servers.push_back(options.data_server);
  } else {
    servers.assign(job.status().live_data_servers().begin(),
                   job.status().live_data_servers().end());
  }
  absl::Status last = absl::UnavailableError(
      absl::StrCat("no data server of job ", options.job, " is live"));
  for (const std::string& address : servers) {
    auto data = v1::DataServer::NewStub(
        grpc::CreateChannel(GrpcTarget(address), coordinator.credentials()));
    grpc::ClientContext ctx;
    SetDeadline(ctx, options.timeout);
    v1::ReadRequest read;
    *read.mutable_lease() = page.samples(0).replay_lease();
    *read.mutable_decode() = options.decode;
    for (const std::string& f : options.fields) read.add_fields(f);
    v1::ReplayedSample replayed;
    last = FromGrpcStatus(data->ReplaySample(&ctx, read, &replayed));
    if (last.ok()) {
      result.data_server = address;
      if (result.audited.key.empty()) {
        result.audited.key = replayed.sample().key();
      }
      result.replayed = std::move(replayed);
      return result;
    }
    last = absl::Status(last.code(), absl::StrCat("data server ", address, ": ",
                                                  last.message()));
    if (!absl::IsUnavailable(last) && !absl::IsDeadlineExceeded(last)) break;
  }
  return last;
}

}  // namespace sluice
