// sluicectl audit: the samples one reader of a job took in an epoch, in the
// order it took them (the coordinator's Audit), with each sample's key
// looked up on a live data server (IndexShard).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli/cli.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"
#include "sluice/v1/dataserver.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int32_t, rank);
ABSL_DECLARE_FLAG(int32_t, worker);
ABSL_FLAG(int64_t, epoch, -1, "audit: the epoch (required).");
ABSL_FLAG(int64_t, from, 0,
          "audit: the first position listed (0-based, in the reader's order).");
ABSL_FLAG(int64_t, count, -1,
          "audit: most samples listed (-1 = all from --from on).");
ABSL_FLAG(bool, keys, true,
          "audit: look each sample's key up on a live data server.");

namespace sluice::cli {
namespace {

// Sample keys per shard URL, read once per shard from a data server.
class KeyBook {
 public:
  explicit KeyBook(std::vector<std::string> data_servers)
      : data_servers_(std::move(data_servers)) {}

  // The key of sample `index` of `url`; empty when no data server could
  // index the shard (said once on stderr).
  std::string Key(const std::string& url, int64_t index) {
    auto it = keys_.find(url);
    if (it == keys_.end()) it = keys_.emplace(url, Look(url)).first;
    const std::vector<std::string>& keys = it->second;
    return index >= 0 && index < static_cast<int64_t>(keys.size())
               ? keys[index]
               : std::string();
  }

 private:
  std::vector<std::string> Look(const std::string& url) {
    absl::Status last = absl::UnavailableError("no data server is live");
    for (const std::string& address : data_servers_) {
      auto stub =
          v1::DataServer::NewStub(grpc::CreateChannel(address, Credentials()));
      v1::IndexShardRequest request;
      request.set_url(url);
      request.set_include_samples(true);
      v1::ShardIndex index;
      last =
          FromGrpcStatus(stub->IndexShard(Deadline().get(), request, &index));
      if (last.ok()) return {index.keys().begin(), index.keys().end()};
    }
    if (!warned_) {
      std::fprintf(stderr,
                   "sluicectl audit: keys not shown: indexing %s failed: %s\n",
                   url.c_str(), std::string(last.message()).c_str());
      warned_ = true;
    }
    return {};
  }

  std::vector<std::string> data_servers_;
  std::map<std::string, std::vector<std::string>> keys_;
  bool warned_ = false;
};

std::string JsonLine(const v1::AuditedSample& s, const std::string& key) {
  nlohmann::ordered_json line;
  line["position"] = s.position();
  line["key"] = key;
  if (!s.source().empty()) line["source"] = s.source();
  line["shard"] = s.shard_index();
  line["url"] = s.shard_url();
  line["index"] = s.index();
  line["unit"] = s.sequence();
  line["unit_kind"] = s.unit_kind();
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace

int AuditCommand(const std::vector<std::string>& args) {
  if (args.size() != 1)
    return Usage("audit takes one job name (sluicectl audit JOB --epoch E)");
  const int64_t epoch = absl::GetFlag(FLAGS_epoch);
  if (epoch < 0) return Usage("audit: --epoch is required (0 or more)");
  const int64_t from = absl::GetFlag(FLAGS_from);
  if (from < 0) return Usage("audit: --from must be 0 or more");
  const int64_t count = absl::GetFlag(FLAGS_count);
  if (count < -1) return Usage("audit: --count must be -1 (all) or more");
  auto stub = CoordinatorStub(absl::GetFlag(FLAGS_coordinator));

  std::vector<std::string> data_servers;
  if (absl::GetFlag(FLAGS_keys)) {
    v1::GetJobRequest request;
    request.set_name(args[0]);
    v1::Job job;
    absl::Status s =
        Rpc(stub->GetJob(Deadline().get(), request, &job), "audit " + args[0]);
    if (!s.ok()) return Fail(s);
    data_servers.assign(job.status().live_data_servers().begin(),
                        job.status().live_data_servers().end());
  }
  KeyBook keys(std::move(data_servers));

  const bool json = absl::GetFlag(FLAGS_json);
  int64_t position = from;
  int64_t left = count;  // -1: all
  bool header = !json;
  while (left != 0) {
    v1::AuditRequest request;
    request.set_job(args[0]);
    request.set_epoch(epoch);
    request.set_rank(absl::GetFlag(FLAGS_rank));
    request.set_worker(absl::GetFlag(FLAGS_worker));
    request.set_start(position);
    request.set_count(left < 0 ? 10000 : std::min<int64_t>(left, 10000));
    v1::AuditResponse page;
    absl::Status s =
        Rpc(stub->Audit(Deadline().get(), request, &page), "audit " + args[0]);
    if (!s.ok()) return Fail(s);
    if (header) {
      std::printf(
          "# job %s epoch %lld rank %d worker %d: %lld samples acknowledged\n"
          "# position key shard index source unit\n",
          page.job().c_str(), static_cast<long long>(page.epoch()), page.rank(),
          page.worker(), static_cast<long long>(page.total()));
      header = false;
    }
    if (page.samples_size() == 0) break;
    for (const v1::AuditedSample& sample : page.samples()) {
      const std::string key = keys.Key(sample.shard_url(), sample.index());
      if (json) {
        std::fputs(JsonLine(sample, key).c_str(), stdout);
      } else {
        std::printf("%lld %s %s %lld %s %s %lld\n",
                    static_cast<long long>(sample.position()),
                    key.empty() ? "-" : key.c_str(), sample.shard_url().c_str(),
                    static_cast<long long>(sample.index()),
                    sample.source().empty() ? "-" : sample.source().c_str(),
                    sample.unit_kind().c_str(),
                    static_cast<long long>(sample.sequence()));
      }
    }
    position += page.samples_size();
    if (left > 0) left -= page.samples_size();
  }
  return kOk;
}

}  // namespace sluice::cli
