// sluicectl: the command line of Sluice. Data on stdout, logs on stderr.
#include <fcntl.h>
#include <glob.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/lease_token.h"
#include "server/common/status_macros.h"
#include "server/common/tls_files.h"
#include "server/common/tls_probe.h"
#include "server/dataserver/shard_store.h"
#include "server/dataserver/tar_shard_reader.h"
#include "sluice/reader.h"
#include "sluice/v1/dataserver.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070",
          "Coordinator HOST:PORT, or several IPv4 HOST:PORTs comma-separated "
          "(calls go to the ready one: with an etcd journal, the leader). "
          "Default: $SLUICE_COORDINATOR when set.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each RPC.");
ABSL_FLAG(bool, json, false, "Print data as JSON.");
// job create
ABSL_FLAG(std::string, name, "", "job create: job name.");
ABSL_FLAG(std::string, manifest, "",
          "job create: manifest JSON file (see `sluicectl index`).");
ABSL_FLAG(int32_t, world_size, 1, "job create: ranks (0 = no quotas).");
ABSL_FLAG(int64_t, epochs, 1, "job create: epochs (0 = endless).");
ABSL_FLAG(std::string, mode, "static", "job create: static | dynamic.");
ABSL_FLAG(std::string, remainder, "drop", "job create: drop | pad.");
ABSL_FLAG(std::string, on_corrupt, "skip", "job create: skip | fail.");
ABSL_FLAG(uint64_t, seed, 0, "job create: shuffle seed.");
ABSL_FLAG(bool, shuffle, true,
          "job create: shuffle each epoch (--noshuffle to keep order).");
ABSL_FLAG(absl::Duration, lease_ttl, absl::ZeroDuration(),
          "job create: lease TTL (0 = coordinator default).");
ABSL_FLAG(int64_t, max_samples_per_lease, 0,
          "job create: largest unit (0 = whole shards).");
ABSL_FLAG(int32_t, shuffle_window, 0,
          "job create: shards mixed into each shuffle window (0 = the "
          "coordinator's default of 32; 1 = shard order only).");
ABSL_FLAG(int64_t, samples_per_epoch, 0,
          "job create: samples per epoch of a job with --source flags "
          "(required with weights; 0 = the sum of their samples=).");
// Documents --source for --help; its values never reach the flag: it may
// repeat and holds commas, so main() takes every one out of argv before the
// flags are parsed (SourceArgs()).
ABSL_FLAG(std::string, source, "",
          "job create: one dataset of a job that mixes several: "
          "name=N,manifest=FILE,weight=W|samples=N[,on_exhausted=repeat|stop]; "
          "give the flag once per source.");
// read
ABSL_FLAG(std::string, job, "", "read: job name.");
ABSL_FLAG(int32_t, rank, 0, "read: rank.");
ABSL_FLAG(int32_t, worker, 0,
          "read: this reader's index among the rank's --workers.");
ABSL_FLAG(int32_t, workers, 0,
          "read: readers sharing the rank (0 = 1); each reads a fixed share of "
          "its quota.");
ABSL_FLAG(int64_t, read_epochs, 0,
          "read: stop after this many epochs end (0 = until the job is done).");
ABSL_FLAG(bool, decode, false, "read: ask the data server to decode fields.");
ABSL_FLAG(std::string, decode_spec, "",
          "read: a sluice.v1.DecodeSpec in protobuf text format, e.g. image "
          "transforms: "
          "'transforms { random_resized_crop { height: 224 width: 224 } } "
          "transforms { horizontal_flip { p: 0.5 } }' (implies --decode).");
ABSL_FLAG(std::string, trainer_id, "",
          "read: trainer id (default host-pid-rank-worker).");
ABSL_FLAG(double, rate, 0,
          "read: at most this many samples/s (emulates a training step; 0 = as "
          "fast as possible).");
ABSL_FLAG(absl::Duration, progress_interval, absl::Milliseconds(500),
          "read: longest time between delivering a sample and reporting it.");
// health
ABSL_FLAG(
    std::string, service, "",
    "health: service name (\"readiness\" for readiness; empty = overall).");
ABSL_FLAG(bool, wait, false,
          "health: keep asking until the status is SERVING (or --timeout "
          "passes), for scripts that start a server and wait for it.");
// index
ABSL_FLAG(std::string, o, "",
          "index: write the manifest here (default stdout).");
ABSL_FLAG(
    std::string, admin_token_file, "",
    "job create/delete: file holding the coordinator's operator token (its "
    "--admin_token_file), sent as \"authorization: Bearer <token>\".");
ABSL_FLAG(std::string, ca_cert, "",
          "PEM CA certificate(s): set = talk TLS to the coordinator and data "
          "servers, "
          "verifying them against it.");
ABSL_FLAG(std::string, client_cert, "",
          "PEM client certificate for servers that demand one (mutual TLS); "
          "needs --ca_cert.");
ABSL_FLAG(std::string, client_key, "", "PEM private key for --client_cert.");
ABSL_FLAG(std::string, data_server, "",
          "index: HOST:PORT of a data server to index the shards through "
          "(IndexShard): the "
          "arguments are then shard URLs (http://, https://, s3://, or paths "
          "the server may "
          "read); remote shards land in its cache on the way.");
ABSL_FLAG(std::string, url_prefix, "",
          "index (local): write each shard's URL as this prefix + its path "
          "relative to the "
          "indexed directory (e.g. https://host/shards/), for shards published "
          "remotely.");
ABSL_FLAG(bool, checksum, false,
          "index (local): record each shard's sha256 so data servers verify "
          "downloads.");

namespace sluice::cli {

int Fail(const absl::Status& status) {
  // Code and message (not ToString(): its payloads are raw bytes).
  std::fprintf(stderr, "sluicectl: %s: %s\n",
               absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status))
    return kUnreachable;
  return kError;
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "sluicectl: %s (see sluicectl --help)\n",
               message.c_str());
  return kUsage;
}

namespace {

// One `read` output line: the documented shape (client/README.md).
std::string SampleJsonLine(const Sample& s) {
  nlohmann::ordered_json line;
  line["epoch"] = s.epoch;
  line["rank"] = s.rank;
  if (!s.source.empty()) line["source"] = s.source;
  line["shard"] = s.shard_index;
  line["index"] = s.index;
  // Keys and names are bytes from the shard: invalid UTF-8 is replaced,
  // never an exception.
  line["key"] = s.key;
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  nlohmann::ordered_json shapes = nlohmann::ordered_json::object();
  for (const v1::Field& f : s.fields) {
    const size_t size = f.has_tensor()      ? f.tensor().data().size()
                        : f.has_text()      ? f.text().size()
                        : f.has_int_value() ? 8
                                            : f.raw().size();
    fields[f.name()] = size;
    if (f.has_tensor()) {
      shapes[f.name()] = std::vector<int64_t>(f.tensor().shape().begin(),
                                              f.tensor().shape().end());
    }
  }
  line["fields"] = std::move(fields);
  if (!shapes.empty()) line["shapes"] = std::move(shapes);
  if (s.skipped) {
    line["skipped"] = true;
    line["skip_reason"] = s.skip_reason;
  }
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
         "\n";
}

}  // namespace

namespace {
std::shared_ptr<grpc::ChannelCredentials>& CredentialsSlot() {
  static auto* creds = new std::shared_ptr<grpc::ChannelCredentials>();
  return *creds;
}

}  // namespace

// The operator token of --admin_token_file (empty: none).
std::string& AdminToken() {
  static std::string* token = new std::string();
  return *token;
}

absl::Status LoadCredentials() {
  ASSIGN_OR_RETURN(
      CredentialsSlot(),
      ClientCredentialsFromFiles(ClientTlsFiles{
          absl::GetFlag(FLAGS_ca_cert), absl::GetFlag(FLAGS_client_cert),
          absl::GetFlag(FLAGS_client_key), "--ca_cert", "--client_cert",
          "--client_key"}));
  ASSIGN_OR_RETURN(AdminToken(),
                   ReadSecretFile(absl::GetFlag(FLAGS_admin_token_file),
                                  "admin_token_file"));
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> Credentials() {
  return CredentialsSlot() != nullptr ? CredentialsSlot()
                                      : grpc::InsecureChannelCredentials();
}

std::shared_ptr<grpc::ChannelCredentials> TlsCredentialsOrNull() {
  if (absl::GetFlag(FLAGS_ca_cert).empty()) return nullptr;
  return Credentials();
}

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(
    const std::string& address) {
  return v1::Coordinator::NewStub(CoordinatorChannel(address, Credentials()));
}

std::unique_ptr<grpc::ClientContext> Deadline() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(
      absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
  // The operator token, for a coordinator started with --admin_token_file.
  if (!AdminToken().empty()) {
    ctx->AddMetadata("authorization", "Bearer " + AdminToken());
  }
  return ctx;
}

absl::Status Rpc(const grpc::Status& s, const std::string& what) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    absl::Status mismatch =
        CheckTransport("coordinator", absl::GetFlag(FLAGS_coordinator),
                       !absl::GetFlag(FLAGS_ca_cert).empty(), "--ca_cert");
    if (!mismatch.ok()) {
      return absl::Status(mismatch.code(),
                          absl::StrCat(what, ": ", mismatch.message()));
    }
    return absl::Status(
        status.code(),
        absl::StrCat(what, ": coordinator ", absl::GetFlag(FLAGS_coordinator),
                     " unreachable: ", status.message()));
  }
  return absl::Status(status.code(),
                      absl::StrCat(what, ": ", status.message()));
}

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, options);
  return out;
}

namespace {

// `order`: also how the job orders its samples.
void PrintJob(const v1::Job& job, bool order = true) {
  const v1::JobStatus& s = job.status();
  std::printf(
      "%-20s %-8s epoch %lld/%lld  %lld/%lld samples  world %d  %d shards\n",
      job.spec().name().c_str(),
      v1::JobState_Name(s.state()).substr(10).c_str(),
      static_cast<long long>(s.epoch()),
      static_cast<long long>(job.spec().num_epochs()),
      static_cast<long long>(s.consumed_in_epoch()),
      static_cast<long long>(s.samples_per_epoch()), job.spec().world_size(),
      s.num_shards());
  if (!order) return;
  if (job.spec().sources_size() > 0) {
    std::vector<std::string> parts;
    for (const v1::Source& src : job.spec().sources()) {
      parts.push_back(
          src.samples_per_epoch() > 0
              ? absl::StrCat(src.name(), " ", src.samples_per_epoch())
              : absl::StrCat(src.name(), " x", src.weight()));
    }
    std::printf("%-20s sources: %s per epoch of %lld, interleaved\n", "",
                absl::StrJoin(parts, ", ").c_str(),
                static_cast<long long>(job.spec().samples_per_epoch()));
  }
  if (!job.spec().shuffle()) {
    std::printf("%-20s order: manifest order every epoch\n", "");
  } else if (job.spec().shuffle_window() > 1) {
    std::printf(
        "%-20s order: shards shuffled, samples mixed in windows of %d "
        "shards\n",
        "", job.spec().shuffle_window());
  } else {
    std::printf("%-20s order: shards shuffled, each unit from one shard\n", "");
  }
}

void PrintJobOrJson(const v1::Job& job) {
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s", ToJson(job).c_str());
  } else {
    PrintJob(job);
  }
}

}  // namespace

std::vector<std::string>& SourceArgs() {
  static auto* sources = new std::vector<std::string>();
  return *sources;
}

namespace {

absl::Status ReadManifestInto(const std::string& path, const std::string& flag,
                              v1::Manifest* manifest) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  auto parsed = google::protobuf::util::JsonStringToMessage(text, manifest);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": ", parsed.ToString()));
  }
  return absl::OkStatus();
}

// One --source value: comma-separated key=value pairs.
absl::Status ParseSource(const std::string& text, v1::Source* source) {
  const std::string flag = absl::StrCat("--source ", text);
  bool has_manifest = false;
  for (absl::string_view pair : absl::StrSplit(text, ',')) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", pair, "\" is not key=value"));
    }
    const std::string key(pair.substr(0, eq));
    const std::string value(pair.substr(eq + 1));
    if (key == "name") {
      source->set_name(value);
    } else if (key == "manifest") {
      RETURN_IF_ERROR(
          ReadManifestInto(value, flag, source->mutable_manifest()));
      has_manifest = true;
    } else if (key == "weight") {
      double w = 0;
      if (!absl::SimpleAtod(value, &w)) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": weight \"", value, "\" is not a number"));
      }
      source->set_weight(w);
    } else if (key == "samples") {
      int64_t n = 0;
      if (!absl::SimpleAtoi(value, &n)) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": samples \"", value, "\" is not an integer"));
      }
      source->set_samples_per_epoch(n);
    } else if (key == "on_exhausted") {
      if (value != "repeat" && value != "stop") {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": on_exhausted must be repeat or stop"));
      }
      source->set_on_exhausted(value == "stop" ? v1::ON_EXHAUSTED_STOP
                                               : v1::ON_EXHAUSTED_REPEAT);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": unknown key \"", key,
                       "\" (name, manifest, weight, samples, on_exhausted)"));
    }
  }
  if (source->name().empty() || !has_manifest) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": give at least name= and manifest="));
  }
  return absl::OkStatus();
}

}  // namespace

int JobCommand(const std::vector<std::string>& args) {
  if (args.empty()) return Usage("job: create | get NAME | list | delete NAME");
  auto stub = CoordinatorStub(absl::GetFlag(FLAGS_coordinator));
  const std::string& verb = args[0];
  if (verb == "create") {
    v1::CreateJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name(absl::GetFlag(FLAGS_name));
    if (spec->name().empty()) return Usage("job create: --name is required");
    const std::string manifest = absl::GetFlag(FLAGS_manifest);
    if (manifest.empty() == SourceArgs().empty()) {
      return Usage(
          "job create: give --manifest, or one --source per dataset to mix");
    }
    if (!manifest.empty()) {
      absl::Status read =
          ReadManifestInto(manifest, "--manifest", spec->mutable_manifest());
      if (!read.ok()) return Fail(read);
    }
    for (const std::string& text : SourceArgs()) {
      absl::Status parsed = ParseSource(text, spec->add_sources());
      if (!parsed.ok()) {
        return parsed.code() == absl::StatusCode::kInvalidArgument
                   ? Usage(std::string(parsed.message()))
                   : Fail(parsed);
      }
    }
    spec->set_samples_per_epoch(absl::GetFlag(FLAGS_samples_per_epoch));
    spec->set_world_size(absl::GetFlag(FLAGS_world_size));
    spec->set_num_epochs(absl::GetFlag(FLAGS_epochs));
    spec->set_seed(absl::GetFlag(FLAGS_seed));
    spec->set_shuffle(absl::GetFlag(FLAGS_shuffle));
    const std::string mode = absl::GetFlag(FLAGS_mode);
    if (mode != "static" && mode != "dynamic")
      return Usage("--mode must be static or dynamic");
    spec->set_mode(mode == "static" ? v1::MODE_STATIC : v1::MODE_DYNAMIC);
    const std::string rem = absl::GetFlag(FLAGS_remainder);
    if (rem != "drop" && rem != "pad")
      return Usage("--remainder must be drop or pad");
    spec->set_remainder(rem == "drop" ? v1::REMAINDER_DROP : v1::REMAINDER_PAD);
    const std::string corrupt = absl::GetFlag(FLAGS_on_corrupt);
    if (corrupt != "skip" && corrupt != "fail")
      return Usage("--on_corrupt must be skip or fail");
    spec->set_on_corrupt(corrupt == "skip" ? v1::CORRUPT_POLICY_SKIP
                                           : v1::CORRUPT_POLICY_FAIL);
    spec->set_lease_ttl_ms(
        absl::ToInt64Milliseconds(absl::GetFlag(FLAGS_lease_ttl)));
    spec->set_max_samples_per_lease(absl::GetFlag(FLAGS_max_samples_per_lease));
    spec->set_shuffle_window(absl::GetFlag(FLAGS_shuffle_window));
    v1::Job job;
    absl::Status s =
        Rpc(stub->CreateJob(Deadline().get(), request, &job), "job create");
    if (!s.ok()) return Fail(s);
    PrintJobOrJson(job);
    return kOk;
  }
  if (verb == "get" || verb == "delete") {
    if (args.size() != 2) return Usage("job " + verb + ": give one job name");
    if (verb == "delete") {
      v1::DeleteJobRequest request;
      request.set_name(args[1]);
      v1::DeleteJobResponse response;
      absl::Status s = Rpc(
          stub->DeleteJob(Deadline().get(), request, &response), "job delete");
      if (!s.ok()) return Fail(s);
      std::fprintf(stderr, "deleted job %s\n", args[1].c_str());
      return kOk;
    }
    v1::GetJobRequest request;
    request.set_name(args[1]);
    v1::Job job;
    absl::Status s =
        Rpc(stub->GetJob(Deadline().get(), request, &job), "job get");
    if (!s.ok()) return Fail(s);
    PrintJobOrJson(job);
    return kOk;
  }
  if (verb == "list") {
    v1::ListJobsResponse response;
    absl::Status s =
        Rpc(stub->ListJobs(Deadline().get(), v1::ListJobsRequest(), &response),
            "job list");
    if (!s.ok()) return Fail(s);
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s", ToJson(response).c_str());
    } else {
      for (const v1::Job& job : response.jobs()) PrintJob(job, false);
    }
    return kOk;
  }
  return Usage("job: unknown verb \"" + verb + "\"");
}

// One coordinator's role: "leader", "standby (leader: ADDR)", "not ready"
// or "unreachable: ...".
std::string CoordinatorRole(const std::string& address) {
  auto channel = grpc::CreateChannel(address, Credentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("readiness");
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = health->Check(Deadline().get(), request, &response);
  if (!s.ok()) return absl::StrCat("unreachable: ", s.error_message());
  if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
    return "leader";
  }
  // A standby answers every RPC with UNAVAILABLE and NotLeader details.
  v1::ListJobsResponse jobs;
  s = v1::Coordinator::NewStub(channel)->ListJobs(Deadline().get(),
                                                  v1::ListJobsRequest(), &jobs);
  v1::RpcStatus rpc;
  if (!s.ok() && rpc.ParseFromString(s.error_details())) {
    for (const v1::AnyDetail& any : rpc.details()) {
      v1::NotLeader hint;
      if (any.type_url() == "type.googleapis.com/sluice.v1.NotLeader" &&
          hint.ParseFromString(any.value())) {
        return hint.leader().empty()
                   ? "standby (no coordinator leads)"
                   : absl::StrCat("standby (leader: ", hint.leader(), ")");
      }
    }
  }
  return "not ready (starting or draining)";
}

int StatusCommand(const std::vector<std::string>& args) {
  const std::string coordinators = absl::GetFlag(FLAGS_coordinator);
  if (coordinators.find(',') != std::string::npos &&
      !absl::GetFlag(FLAGS_json)) {
    std::printf("coordinators:\n");
    for (absl::string_view address : absl::StrSplit(coordinators, ',')) {
      std::printf("  %-21s %s\n", std::string(address).c_str(),
                  CoordinatorRole(std::string(address)).c_str());
    }
  }
  auto stub = CoordinatorStub(coordinators);
  std::vector<v1::Job> jobs;
  if (args.empty()) {
    v1::ListJobsResponse response;
    absl::Status s =
        Rpc(stub->ListJobs(Deadline().get(), v1::ListJobsRequest(), &response),
            "status");
    if (!s.ok()) return Fail(s);
    jobs.assign(response.jobs().begin(), response.jobs().end());
    if (jobs.empty() && !absl::GetFlag(FLAGS_json)) {
      std::printf(
          "no jobs; data servers: %s\n",
          response.live_data_servers().empty()
              ? "none live"
              : absl::StrJoin(response.live_data_servers(), ", ").c_str());
    }
  } else {
    for (const std::string& name : args) {
      v1::GetJobRequest request;
      request.set_name(name);
      v1::Job job;
      absl::Status s =
          Rpc(stub->GetJob(Deadline().get(), request, &job), "status");
      if (!s.ok()) return Fail(s);
      jobs.push_back(job);
    }
  }
  for (const v1::Job& job : jobs) {
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s", ToJson(job).c_str());
      continue;
    }
    PrintJob(job, false);
    std::printf(
        "  data servers: %s\n",
        job.status().live_data_servers().empty()
            ? "none live"
            : absl::StrJoin(job.status().live_data_servers(), ", ").c_str());
    // A rank's lag: samples behind the most advanced rank this epoch.
    int64_t most = 0;
    for (const v1::RankStatus& r : job.status().ranks()) {
      most = std::max<int64_t>(most, r.consumed());
    }
    for (const v1::RankStatus& r : job.status().ranks()) {
      std::printf(
          "  rank %-4d %8lld / %-8lld consumed  lag %-6lld %d live leases  %d "
          "sessions  input wait %.1fs\n",
          r.rank(), static_cast<long long>(r.consumed()),
          static_cast<long long>(r.quota()),
          static_cast<long long>(most - r.consumed()), r.live_leases(),
          r.sessions(), r.input_wait_seconds());
    }
    for (const v1::SourceStatus& src : job.status().sources()) {
      std::printf(
          "  source %-14s %8lld / %-8lld consumed  pass %lld at %lld/%lld%s\n",
          src.name().c_str(), static_cast<long long>(src.consumed_in_epoch()),
          static_cast<long long>(src.samples_in_epoch()),
          static_cast<long long>(src.pass()),
          static_cast<long long>(src.pass_position()),
          static_cast<long long>(src.num_samples()),
          src.stopped() ? "  (stopped: used up)" : "");
    }
  }
  return kOk;
}

int ReadCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("read takes no positional arguments");
  ReaderOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.credentials = TlsCredentialsOrNull();
  options.job = absl::GetFlag(FLAGS_job);
  if (options.job.empty()) return Usage("read: --job is required");
  options.rank = absl::GetFlag(FLAGS_rank);
  options.worker = absl::GetFlag(FLAGS_worker);
  options.num_workers = absl::GetFlag(FLAGS_workers);
  options.trainer_id = absl::GetFlag(FLAGS_trainer_id);
  if (const std::string spec = absl::GetFlag(FLAGS_decode_spec);
      !spec.empty()) {
    google::protobuf::TextFormat::Parser parser;
    if (!parser.ParseFromString(spec, &options.decode)) {
      return Usage(
          "read: --decode_spec is not a sluice.v1.DecodeSpec in text format");
    }
    options.decode.set_decode(true);
  }
  if (absl::GetFlag(FLAGS_decode)) options.decode.set_decode(true);
  options.progress_interval = absl::GetFlag(FLAGS_progress_interval);
  // Unreachable at the start: fail within --timeout. Once reading, ride out
  // a coordinator restart of up to 30 s (or --timeout, if longer).
  {
    auto channel = CoordinatorChannel(options.coordinator, Credentials());
    const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
    // A first, short wait: a coordinator that speaks TLS while this client
    // does not (or the reverse) never connects, and is named at once.
    bool connected = channel->WaitForConnected(absl::ToChronoTime(
        std::min(deadline, absl::Now() + absl::Milliseconds(500))));
    if (!connected) {
      absl::Status mismatch =
          CheckTransport("coordinator", options.coordinator,
                         !absl::GetFlag(FLAGS_ca_cert).empty(), "--ca_cert");
      if (!mismatch.ok()) {
        return Fail(absl::Status(mismatch.code(),
                                 absl::StrCat("read: ", mismatch.message())));
      }
      connected = channel->WaitForConnected(absl::ToChronoTime(deadline));
    }
    if (!connected) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "read: coordinator ", options.coordinator, " unreachable for ",
          absl::FormatDuration(absl::GetFlag(FLAGS_timeout)), " (--timeout)")));
    }
  }
  options.reconnect_timeout =
      std::max(absl::GetFlag(FLAGS_timeout), absl::Seconds(30));
  // This process only reads: keep freed megabyte buffers (malloc_tuning.h).
  (void)TuneMallocForStreaming();
  auto reader = Reader::Create(options);
  if (!reader.ok()) return Fail(reader.status());
  const int64_t max_epochs = absl::GetFlag(FLAGS_read_epochs);
  const double rate = absl::GetFlag(FLAGS_rate);
  const absl::Time start = absl::Now();
  int64_t delivered = 0, epochs_done = 0;
  bool began =
      false;  // an epoch began for this reader (else a done job is an error)
  while (true) {
    auto event = (*reader)->Next();
    if (!event.ok()) return Fail(event.status());
    if (event->kind == ReaderEvent::Kind::kDone) {
      if (began) break;
      std::fprintf(stderr, "sluicectl: %s\n", event->message.c_str());
      return kJobDone;
    }
    if (event->kind == ReaderEvent::Kind::kEpochBegin) {
      began = true;
      std::fprintf(stderr,
                   "epoch %lld begins: %lld samples for rank %d (%lld already "
                   "consumed)\n",
                   static_cast<long long>(event->epoch),
                   static_cast<long long>(event->samples_for_rank),
                   options.rank,
                   static_cast<long long>(event->already_consumed));
      continue;
    }
    if (event->kind == ReaderEvent::Kind::kEpochEnd) {
      std::fprintf(stderr, "epoch %lld ends\n",
                   static_cast<long long>(event->epoch));
      if (max_epochs > 0 && ++epochs_done >= max_epochs) break;
      continue;
    }
    const std::string line = SampleJsonLine(event->sample);
    // One write per line: a reader killed mid-run leaves whole lines behind.
    if (write(STDOUT_FILENO, line.data(), line.size()) < 0)
      return Fail(absl::InternalError("stdout closed"));
    ++delivered;
    if (rate > 0) {
      absl::Time due = start + absl::Seconds(delivered / rate);
      if (due > absl::Now())
        absl::SleepFor(due - absl::Now());  // emulated training step
    }
  }
  ReaderStats stats = (*reader)->stats();
  (*reader)->Close();
  std::fprintf(stderr,
               "read %lld samples (%lld units, %lld re-routed, %lld dropped, "
               "%lld reconnects)\n",
               static_cast<long long>(stats.delivered),
               static_cast<long long>(stats.units_completed),
               static_cast<long long>(stats.reroutes),
               static_cast<long long>(stats.dropped_units),
               static_cast<long long>(stats.reconnects));
  return kOk;
}

int HealthCommand(const std::vector<std::string>& args) {
  if (args.size() != 1) return Usage("health: give one HOST:PORT");
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(args[0], Credentials()));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(absl::GetFlag(FLAGS_service));
  grpc::health::v1::HealthCheckResponse response;
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
  absl::Status s;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    s = FromGrpcStatus(stub->Check(&ctx, request, &response));
    const bool serving =
        s.ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    if (serving || !absl::GetFlag(FLAGS_wait) ||
        absl::Now() + absl::Milliseconds(100) >= deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // --wait: ask again
  }
  if (!s.ok()) {
    return Fail(absl::Status(
        s.code(), absl::StrCat("health ", args[0], ": ", s.message())));
  }
  std::string status =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
          response.status());
  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json out;
    out["address"] = args[0];
    out["status"] = status;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s %s\n", args[0].c_str(), status.c_str());
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? kOk
             : kError;
}

// The manifest entry of `url` as the data server at `address` indexes it.
absl::StatusOr<v1::Shard> IndexThroughDataServer(v1::DataServer::Stub& stub,
                                                 const std::string& url) {
  grpc::ClientContext ctx;
  // Indexing a remote shard downloads it first: allow for that.
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(std::max(absl::GetFlag(FLAGS_timeout),
                                                  absl::Minutes(10))));
  v1::IndexShardRequest request;
  request.set_url(url);
  v1::ShardIndex index;
  absl::Status s = FromGrpcStatus(stub.IndexShard(&ctx, request, &index));
  if (!s.ok())
    return absl::Status(s.code(),
                        absl::StrCat("index ", url, ": ", s.message()));
  v1::Shard shard;
  shard.set_url(url);
  shard.set_num_samples(index.num_samples());
  shard.set_size_bytes(index.size_bytes());
  return shard;
}

std::string FileSha256(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i)
    absl::StrAppendFormat(&hex, "%02x", digest[i]);
  return hex;
}

int IndexCommand(const std::vector<std::string>& args) {
  if (args.empty())
    return Usage(
        "index: give a directory or a glob of shards (or URLs with "
        "--data_server)");
  const std::string data_server = absl::GetFlag(FLAGS_data_server);
  std::vector<std::string> paths;
  // Local: the directory each path was found under, for --url_prefix.
  std::map<std::string, std::string> base_of;
  if (!data_server.empty()) {
    if (!absl::GetFlag(FLAGS_url_prefix).empty() ||
        absl::GetFlag(FLAGS_checksum)) {
      return Usage(
          "index: --url_prefix and --checksum index local files; not with "
          "--data_server");
    }
    paths = args;
  }
  for (const std::string& arg :
       data_server.empty() ? args : std::vector<std::string>{}) {
    struct stat st;
    std::string pattern = arg;
    std::string base;
    if (stat(arg.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      pattern = arg + "/*.tar*";
      char real[PATH_MAX];
      if (realpath(arg.c_str(), real) != nullptr) base = real;
    }
    glob_t g;
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        char real[PATH_MAX];
        if (realpath(g.gl_pathv[i], real) != nullptr) {
          paths.emplace_back(real);
          std::string dir = base.empty() ? std::string(real).substr(
                                               0, std::string(real).rfind('/'))
                                         : base;
          base_of[real] = dir;
        }
      }
    }
    globfree(&g);
  }
  if (data_server.empty()) std::sort(paths.begin(), paths.end());
  if (paths.empty())
    return Fail(absl::NotFoundError("index: no shards match " +
                                    absl::StrJoin(args, " ")));
  std::unique_ptr<v1::DataServer::Stub> stub;
  if (!data_server.empty()) {
    stub = v1::DataServer::NewStub(
        grpc::CreateChannel(data_server, Credentials()));
  }
  const std::string url_prefix = absl::GetFlag(FLAGS_url_prefix);
  const bool tty = isatty(STDERR_FILENO);
  v1::Manifest manifest;
  int64_t samples = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (stub != nullptr) {
      absl::StatusOr<v1::Shard> shard = IndexThroughDataServer(*stub, paths[i]);
      if (!shard.ok()) return Fail(shard.status());
      samples += shard->num_samples();
      *manifest.add_shards() = *std::move(shard);
    } else {
      int fd = open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0)
        return Fail(absl::NotFoundError("index: cannot open " + paths[i]));
      auto shard = dataserver::ShardData::Map(fd, paths[i]);
      if (!shard.ok()) return Fail(shard.status());
      dataserver::ShardIndex index = dataserver::BuildShardIndex(*shard);
      if (!index.damage.empty())
        return Fail(absl::DataLossError("index: " + index.damage));
      v1::Shard* s = manifest.add_shards();
      s->set_url(
          url_prefix.empty()
              ? paths[i]
              : absl::StrCat(url_prefix,
                             absl::EndsWith(url_prefix, "/") ? "" : "/",
                             paths[i].substr(base_of[paths[i]].size() + 1)));
      s->set_num_samples(index.num_samples());
      s->set_size_bytes(index.size_bytes);
      if (absl::GetFlag(FLAGS_checksum))
        s->set_checksum("sha256:" + FileSha256((*shard)->bytes()));
      samples += index.num_samples();
    }
    if (tty) {
      int width = 30, done = static_cast<int>(width * (i + 1) / paths.size());
      std::fprintf(stderr, "\r[%s%s] %zu/%zu shards, %lld samples",
                   std::string(done, '#').c_str(),
                   std::string(width - done, ' ').c_str(), i + 1, paths.size(),
                   static_cast<long long>(samples));
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  std::string json = ToJson(manifest);
  const std::string out = absl::GetFlag(FLAGS_o);
  if (out.empty()) {
    std::printf("%s", json.c_str());
  } else {
    FILE* f = std::fopen(out.c_str(), "wb");
    if (f == nullptr ||
        std::fwrite(json.data(), 1, json.size(), f) != json.size()) {
      return Fail(absl::InternalError("index: cannot write " + out));
    }
    std::fclose(f);
  }
  std::fprintf(stderr, "indexed %zu shards, %lld samples\n", paths.size(),
               static_cast<long long>(samples));
  return kOk;
}

namespace {

constexpr char kHelpText[] = R"(sluicectl: the Sluice command line.

Usage: sluicectl COMMAND [args] [flags]

Commands:
  demo                      the end-to-end demo (generates data, starts a cluster,
                            kills a trainer and a data server, verifies)
  up                        a local cluster in the foreground (--dir, --shards,
                            --data_servers); Ctrl-C stops every child; --ha:
                            two coordinators on a local etcd (one leads)
  index DIR|GLOB [-o FILE]  scan shards locally into a manifest (JSON)
        [--url_prefix=URL --checksum]   ... for shards published at URL
  index --data_server=HOST:PORT URL... [-o FILE]
                            index (remote) shards through a data server
  job create --name N --manifest FILE [--world_size --epochs --mode --remainder
             --seed --[no]shuffle --shuffle_window --lease_ttl --on_corrupt]
  job create --name N --source name=A,manifest=FILE,weight=0.7 --source ...
             --samples_per_epoch N      a job mixing several datasets
  job get NAME | job list | job delete NAME
  status [JOB...]           epoch, per-rank consumed/quota, leases, sessions,
                            live data servers
  read --job J --rank R [--read_epochs N] [--decode] [--decode_spec TEXT] [--rate N]
                            one JSON line per sample on stdout
  health HOST:PORT [--service readiness]
  once NAME [--scope S --id ID --ttl 10s --fail_all] -- COMMAND [ARGS...]
                            runs COMMAND on exactly one of all callers; the
                            others wait; everyone exits with its status
  barrier NAME --participants N --id ID [--timeout 60s --scope S]
                            returns when N distinct ids arrived; on timeout
                            says which are missing (exit 5)

Common flags: --coordinator=HOST:PORT (default 127.0.0.1:7070), --timeout=10s,
--json, --ca_cert=PEM [--client_cert=PEM --client_key=PEM] for TLS. `sluicectl COMMAND --help` shows a command's usage.

Exit codes: 0 ok; 1 the server refused or a local error (the message says
which); 2 bad command line; 3 coordinator or data server unreachable in time;
4 demo verification failed; 5 barrier timed out; 6 `read` on a job that had
already served all its epochs; `once` exits with the command's status.
)";

}  // namespace
}  // namespace sluice::cli

namespace sluice::cli {
namespace {

// Flags every command takes (and absl's own).
constexpr const char* kCommonFlags[] = {
    "coordinator", "timeout",  "json",    "ca_cert",    "client_cert",
    "client_key",  "flagfile", "fromenv", "tryfromenv", "undefok"};

struct CommandHelp {
  const char* name;
  const char* usage;  // what `sluicectl NAME --help` prints first
  std::vector<const char*> flags;
};

const std::vector<CommandHelp>& Commands() {
  static const auto* commands = new std::vector<CommandHelp>{
      {"demo",
       "sluicectl demo [--dir DIR]\n  The end-to-end demo: generates a "
       "dataset, "
       "starts a local cluster, trains four ranks with two DataLoader-like\n  "
       "workers each, SIGKILLs a trainer and a data server, and verifies every "
       "epoch was read exactly once.",
       {"dir", "demo_samples", "demo_shards"}},
      {"up",
       "sluicectl up [--dir DIR] [--shards DIR] [--data_servers N] [--ha] "
       "[--coordinator LISTEN] [--listen_host HOST]\n  A local cluster in the "
       "foreground: a coordinator (--coordinator is its listen address) and "
       "data servers\n  serving --shards; --ha: two coordinators on a local "
       "etcd, one leading. --listen_host=0.0.0.0\n  serves other nodes (every "
       "server binds to it; the coordinator with --coordinator's port). "
       "Ctrl-C stops every child.",
       {"dir", "shards", "data_servers", "ha", "listen_host"}},
      {"index",
       "sluicectl index DIR|GLOB [-o FILE] [--url_prefix URL] [--checksum]\n"
       "sluicectl index --data_server HOST:PORT URL... [-o FILE]\n  Scans "
       "shards into a manifest (JSON): local files, or remote shards through a "
       "data server.",
       {"o", "url_prefix", "checksum", "data_server"}},
      {"job",
       "sluicectl job create --name N --manifest FILE [--world_size --epochs "
       "--mode --remainder --seed --[no]shuffle --lease_ttl --on_corrupt "
       "--max_samples_per_lease --shuffle_window]\n"
       "sluicectl job create --name N --source name=A,manifest=FILE,weight=W "
       "--source name=B,manifest=FILE,weight=W[,on_exhausted=stop] "
       "--samples_per_epoch N [...]\n"
       "  (a source takes weight= or samples=; on_exhausted=repeat|stop)\n"
       "sluicectl job get NAME | job list | job delete NAME\n  Creates, shows "
       "and deletes jobs (create and delete need --admin_token_file on a "
       "secured coordinator).",
       {"name", "manifest", "world_size", "epochs", "mode", "remainder", "seed",
        "shuffle", "lease_ttl", "on_corrupt", "max_samples_per_lease",
        "shuffle_window", "samples_per_epoch", "source", "admin_token_file"}},
      {"status",
       "sluicectl status [JOB...]\n  Per job: epoch, per-rank consumed/quota, "
       "lag behind the most advanced rank, leases, sessions, live data "
       "servers. Given several coordinators "
       "(--coordinator=a,b), first each one's role: leader, standby (naming "
       "the leader) or unreachable.",
       {}},
      {"read",
       "sluicectl read --job J [--rank R] [--read_epochs N] [--decode] "
       "[--decode_spec TEXT] [--rate N]\n  Reads a job as one trainer rank "
       "would, one JSON line per sample on stdout.",
       {"job", "rank", "worker", "workers", "read_epochs", "decode",
        "decode_spec", "rate", "trainer_id", "progress_interval"}},
      {"health",
       "sluicectl health HOST:PORT [--service readiness] [--wait]\n  The "
       "gRPC health status of a server (or of one of its services); with "
       "--wait, once it is SERVING or --timeout has passed.",
       {"service", "wait"}},
      {"once",
       "sluicectl once NAME [--scope S --id ID --ttl 10s --fail_all] -- "
       "COMMAND "
       "[ARGS...]\n  Runs COMMAND on exactly one of all callers; the others "
       "wait; everyone exits with its status.\n"
       "sluicectl once --list [SCOPE]\n  The steps the coordinator remembers "
       "as done or failed, and those running now.\n"
       "sluicectl once --reset NAME [--scope S]\n  Forgets a finished step, "
       "so that its next caller runs it again (needs --admin_token_file on a "
       "secured coordinator).",
       {"scope", "id", "ttl", "fail_all", "list", "reset", "admin_token_file"}},
      {"barrier",
       "sluicectl barrier NAME --participants N --id ID [--timeout 60s --scope "
       "S]\n  Returns when N distinct ids arrived; on timeout says which are "
       "missing (exit 5).",
       {"participants", "id", "scope"}},
  };
  return *commands;
}

// The candidate nearest to `word` by edit distance (adjacent letters
// swapped count as one edit), if close enough to be a typo: 1 edit for
// words of up to 3 letters, 2 beyond; "" if none.
std::string Nearest(const std::string& word,
                    const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = (word.size() <= 3 ? 1 : 2) + 1;
  for (const std::string& c : candidates) {
    // Optimal string alignment distance over the whole table.
    std::vector<std::vector<size_t>> d(word.size() + 1,
                                       std::vector<size_t>(c.size() + 1));
    for (size_t i = 0; i <= word.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= c.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      for (size_t j = 1; j <= c.size(); ++j) {
        d[i][j] =
            std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                      d[i - 1][j - 1] + (word[i - 1] == c[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && word[i - 1] == c[j - 2] &&
            word[i - 2] == c[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    if (d[word.size()][c.size()] < best_distance) {
      best_distance = d[word.size()][c.size()];
      best = c;
    }
  }
  return best;
}

// " (did you mean X?)" or "".
std::string DidYouMean(const std::string& word,
                       const std::vector<std::string>& candidates,
                       const std::string& prefix = "") {
  const std::string nearest = Nearest(word, candidates);
  return nearest.empty()
             ? std::string()
             : absl::StrCat(" (did you mean ", prefix, nearest, "?)");
}

const CommandHelp* FindCommand(const std::string& name) {
  for (const CommandHelp& c : Commands()) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintFlag(const char* name) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return;
  std::printf(
      "  --%s  %s (default: %s)\n", name, flag->Help().c_str(),
      flag->DefaultValue().empty() ? "\"\"" : flag->DefaultValue().c_str());
}

int CommandUsage(const CommandHelp& c) {
  std::printf("%s\n\nFlags:\n", c.usage);
  for (const char* f : c.flags) PrintFlag(f);
  std::printf("\nCommon flags:\n");
  for (const char* f : kCommonFlags) {
    if (std::string(f).find("env") == std::string::npos &&
        std::string(f) != "flagfile" && std::string(f) != "undefok") {
      PrintFlag(f);
    }
  }
  std::printf(
      "\nExit codes: 0 ok; 1 refused or a local error; 2 bad command line; 3 "
      "unreachable; see sluicectl --help.\n");
  return kOk;
}

// The flags named on the command line before a `--`, and the command (the
// first argument that is neither a flag nor a flag's value). INVALID_ARGUMENT
// for a flag sluicectl does not have.
absl::Status ScanCommandLine(int argc, char** argv, std::string* command,
                             std::string* subcommand,
                             std::vector<std::string>* flags) {
  bool value_next = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (value_next) {
      value_next = false;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') {
      if (command->empty()) {
        *command = a;
      } else if (subcommand->empty()) {
        *subcommand = a;
      }
      continue;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) name.resize(eq);
    // Abseil's own usage flags (--helpfull, --version ...): absl handles them.
    static const char* const kUsageFlags[] = {
        "helpfull",  "helpshort", "helppackage",    "helpon",
        "helpmatch", "version",   "only_check_args"};
    if (std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) !=
        std::end(kUsageFlags)) {
      continue;
    }
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && name.rfind("no", 0) == 0) {
      const absl::CommandLineFlag* negated =
          absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) {
        flag = negated;
        name = name.substr(2);
      }
    }
    if (flag == nullptr) {
      // Suggest among the command's flags and the common ones (every
      // command's when no command is known yet).
      std::vector<std::string> known(std::begin(kCommonFlags),
                                     std::end(kCommonFlags));
      for (const CommandHelp& c : Commands()) {
        if (!command->empty() && *command != c.name) continue;
        known.insert(known.end(), c.flags.begin(), c.flags.end());
      }
      const std::string hint = DidYouMean(name, known, "--");
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name,
          !hint.empty()      ? hint
          : command->empty() ? std::string()
                             : absl::StrCat(" (sluicectl ", *command,
                                            " --help lists its flags)")));
    }
    if (!has_value && !flag->IsOfType<bool>()) value_next = true;
    flags->push_back(name);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace sluice::cli

int main(int argc, char** argv) {
  using namespace sluice::cli;
  signal(SIGPIPE, SIG_IGN);
  // `sluicectl`, `sluicectl --help`: the overview; `sluicectl CMD --help`:
  // that command's usage and flags.
  bool help = argc < 2;
  std::string help_command;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;  // the rest belongs to `once`'s command
    if (a == "--help" || a == "-h" || a == "help") {
      help = true;
    } else if (help_command.empty() && !a.empty() && a[0] != '-') {
      help_command = a;
    }
  }
  if (help) {
    if (const CommandHelp* c = FindCommand(help_command)) {
      return CommandUsage(*c);
    }
    std::fputs(kHelpText, stdout);
    return argc < 2 ? kUsage : kOk;
  }
  // --source may repeat, and its value holds commas: take every one out
  // before the flags are parsed (only `job create` takes it).
  std::vector<char*> argv_kept(argv, argv + argc);
  for (size_t i = 1; i < argv_kept.size();) {
    const std::string a = argv_kept[i];
    if (a == "--") break;
    if (a == "--source" || a == "-source") {
      if (i + 1 >= argv_kept.size()) return Usage("--source needs a value");
      SourceArgs().push_back(argv_kept[i + 1]);
      argv_kept.erase(argv_kept.begin() + static_cast<std::ptrdiff_t>(i),
                      argv_kept.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    } else if (absl::StartsWith(a, "--source=") ||
               absl::StartsWith(a, "-source=")) {
      SourceArgs().push_back(a.substr(a.find('=') + 1));
      argv_kept.erase(argv_kept.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  argc = static_cast<int>(argv_kept.size());
  argv_kept.push_back(nullptr);
  argv = argv_kept.data();
  if (!SourceArgs().empty()) {
    std::vector<std::string> words;
    for (int i = 1; i < argc && words.size() < 2; ++i)
      if (argv[i][0] != '-') words.push_back(argv[i]);
    if (words.size() < 2 || words[0] != "job" || words[1] != "create")
      return Usage("--source applies to `job create` only");
  }
  // Every flag must exist and belong to the command it is given to.
  {
    std::string command, subcommand;
    std::vector<std::string> flags;
    if (absl::Status scanned =
            ScanCommandLine(argc, argv, &command, &subcommand, &flags);
        !scanned.ok()) {
      return Usage(std::string(scanned.message()));
    }
    if (const CommandHelp* c = FindCommand(command)) {
      for (const std::string& f : flags) {
        const bool common =
            std::any_of(std::begin(kCommonFlags), std::end(kCommonFlags),
                        [&](const char* k) { return f == k; });
        // Of `job`, only `create` takes the job spec's flags.
        const bool own = std::any_of(c->flags.begin(), c->flags.end(),
                                     [&](const char* k) { return f == k; }) &&
                         (command != "job" || subcommand == "create" ||
                          f == "admin_token_file");
        if (!common && !own) {
          const std::string what =
              command == "job" ? absl::StrCat("job ", subcommand) : command;
          return Usage(absl::StrCat("--", f, " does not apply to `", what,
                                    "` (sluicectl ", command,
                                    " --help lists its flags)"));
        }
      }
    }
  }
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = [](absl::string_view) { return false; };
  config.contains_help_flags = [](absl::string_view f) {
    return absl::StrContains(f, "client/cli");
  };
  config.version_string = [] { return std::string("sluicectl 0.1.0\n"); };
  // Repository-relative file names in --helpfull, not this build's paths.
  config.normalize_filename = [](absl::string_view file) {
    for (absl::string_view root : {"client/", "server/", "absl/"}) {
      const size_t at = file.find(root);
      if (at != absl::string_view::npos) return std::string(file.substr(at));
    }
    return std::string(file);
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(kHelpText);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() < 2) return Usage("no command");
  if (absl::Status creds = LoadCredentials(); !creds.ok())
    return Usage(std::string(creds.message()));
  const std::string command = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());
  // Commands that call a coordinator default to $SLUICE_COORDINATOR, as the
  // Python client does (up and demo start their own and listen there).
  if (command != "up" && command != "demo") {
    const char* env = std::getenv("SLUICE_COORDINATOR");
    const absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag("coordinator");
    if (env != nullptr && *env != '\0' && flag != nullptr &&
        flag->CurrentValue() == flag->DefaultValue()) {
      absl::SetFlag(&FLAGS_coordinator, env);
    }
  }
  if (command == "job") return JobCommand(args);
  if (command == "status") return StatusCommand(args);
  if (command == "read") return ReadCommand(args);
  if (command == "health") return HealthCommand(args);
  if (command == "index") return IndexCommand(args);
  if (command == "up") return UpCommand(args);
  if (command == "demo") return DemoCommand(args);
  if (command == "once") return OnceCommand(args);
  if (command == "barrier") return BarrierCommand(args);
  std::vector<std::string> names;
  for (const CommandHelp& c : Commands()) names.push_back(c.name);
  return Usage("unknown command \"" + command + "\"" +
               DidYouMean(command, names));
}
