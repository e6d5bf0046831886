// sluicectl job (create, get, list, delete) and status.
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(bool, json);

// job create
ABSL_FLAG(std::string, name, "", "job create: job name.");
ABSL_FLAG(std::string, manifest, "",
          "job create: manifest JSON file (see `sluicectl index`).");
ABSL_FLAG(int32_t, world_size, 1, "job create: ranks (0 = no quotas).");
ABSL_FLAG(std::string, pool, "",
          "job create: the data-server pool the job reads from (servers "
          "started with --pool=NAME); default: the default pool.");
ABSL_FLAG(int32_t, weight, 1,
          "job create: the job's share of a data server it shares with other "
          "jobs' streams, against their weights (1-1000).");
ABSL_FLAG(std::string, tenant, "",
          "job create: who the job belongs to, for the coordinator's "
          "per-tenant limits (--max_jobs_per_tenant, "
          "--max_sessions_per_tenant); default: the default tenant.");
ABSL_FLAG(std::string, copy_of, "",
          "job create: copy this job's spec for --world_size ranks (the same "
          "data in the same order; its cursors resume the copy). Default "
          "name: <JOB>.w<world_size>.");
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

namespace sluice::cli {

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
  const v1::JobSpec& spec = job.spec();
  if (!spec.pool().empty() || !spec.tenant().empty() || spec.weight() > 1) {
    std::printf("%-20s pool %s, tenant %s, weight %d\n", "",
                spec.pool().empty() ? "(default)" : spec.pool().c_str(),
                spec.tenant().empty() ? "(default)" : spec.tenant().c_str(),
                std::max(spec.weight(), 1));
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
    const std::string copy_of = absl::GetFlag(FLAGS_copy_of);
    const auto create = [&] {
      v1::Job job;
      absl::Status s =
          Rpc(stub->CreateJob(Deadline().get(), request, &job), "job create");
      if (!s.ok()) return Fail(s);
      PrintJobOrJson(job);
      return static_cast<int>(kOk);
    };
    if (!copy_of.empty()) {
      if (!absl::GetFlag(FLAGS_manifest).empty() || !SourceArgs().empty()) {
        return Usage(
            "job create: --copy_of takes the data from that job; give no "
            "--manifest or --source");
      }
      request.set_copy_of(copy_of);
      spec->set_world_size(absl::GetFlag(FLAGS_world_size));
      if (spec->name().empty())
        spec->set_name(absl::StrCat(copy_of, ".w", spec->world_size()));
      return create();
    }
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
    spec->set_pool(absl::GetFlag(FLAGS_pool));
    spec->set_weight(absl::GetFlag(FLAGS_weight));
    spec->set_tenant(absl::GetFlag(FLAGS_tenant));
    return create();
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
      for (const std::string& name : response.deleted()) {
        if (name == args[1]) continue;
        std::fprintf(stderr,
                     "deleted job %s (its copy for another world size)\n",
                     name.c_str());
      }
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
  // Each address once, as it is now: no waiting for one that is down.
  grpc::Status s = health->Check(Deadline(/*wait_for_ready=*/false).get(),
                                 request, &response);
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
  // --json: one document. One job named: that Job; otherwise a
  // ListJobsResponse, with the fleet (live and wanted data servers, pools)
  // when no job is named.
  const bool json = absl::GetFlag(FLAGS_json);
  if (args.empty()) {
    v1::ListJobsResponse response;
    absl::Status s =
        Rpc(stub->ListJobs(Deadline().get(), v1::ListJobsRequest(), &response),
            "status");
    if (!s.ok()) return Fail(s);
    if (json) {
      std::printf("%s", ToJson(response).c_str());
      return kOk;
    }
    jobs.assign(response.jobs().begin(), response.jobs().end());
    if (jobs.empty()) {
      std::printf(
          "no jobs; data servers: %s\n",
          response.live_data_servers().empty()
              ? "none live"
              : absl::StrJoin(response.live_data_servers(), ", ").c_str());
    }
    if (response.desired_data_servers() >= 0) {
      std::printf(
          "data servers wanted: %d (%d live; trainers waiting for input "
          "%.0f%% of the time)\n",
          response.desired_data_servers(), response.live_data_servers_size(),
          100 * response.input_wait_share());
      // Per pool when there is more than the default pool.
      const bool pools =
          response.pools_size() > 1 ||
          (response.pools_size() == 1 && !response.pools(0).pool().empty());
      for (const v1::PoolFleet& pool : response.pools()) {
        if (!pools || pool.desired_data_servers() < 0) continue;
        std::printf(
            "  pool %s: data servers wanted: %d (%d live, %d draining; "
            "trainers waiting for input %.0f%% of the time)\n",
            pool.pool().empty() ? "(default)" : pool.pool().c_str(),
            pool.desired_data_servers(), pool.live_data_servers(),
            pool.draining_data_servers(), 100 * pool.input_wait_share());
      }
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
  if (json) {
    if (jobs.size() == 1) {
      std::printf("%s", ToJson(jobs[0]).c_str());
    } else {
      v1::ListJobsResponse named;
      for (v1::Job& job : jobs) *named.add_jobs() = std::move(job);
      std::printf("%s", ToJson(named).c_str());
    }
    return kOk;
  }
  for (const v1::Job& job : jobs) {
    PrintJob(job, false);
    std::printf(
        "  data servers: %s\n",
        job.status().live_data_servers().empty()
            ? "none live"
            : absl::StrJoin(job.status().live_data_servers(), ", ").c_str());
    const v1::LeaseCounts& leases = job.status().leases();
    std::printf(
        "  leases: %lld granted, %lld completed, %lld expired, %lld returned "
        "(since this coordinator began serving)\n",
        static_cast<long long>(leases.granted()),
        static_cast<long long>(leases.completed()),
        static_cast<long long>(leases.expired()),
        static_cast<long long>(leases.returned()));
    const int64_t named =
        leases.samples_same_node() + leases.samples_other_node();
    if (named > 0) {
      std::printf(
          "  locality: %.1f%% of the samples granted are read on their "
          "trainer's node (%lld same node, %lld other)\n",
          100.0 * static_cast<double>(leases.samples_same_node()) /
              static_cast<double>(named),
          static_cast<long long>(leases.samples_same_node()),
          static_cast<long long>(leases.samples_other_node()));
    }
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
      const std::string dropped =
          src.dropped_in_epoch() > 0
              ? absl::StrCat("  (", src.dropped_in_epoch(), " dropped)")
              : "";
      std::printf(
          "  source %-14s %8lld / %-8lld consumed  pass %lld at "
          "%lld/%lld%s%s\n",
          src.name().c_str(), static_cast<long long>(src.consumed_in_epoch()),
          static_cast<long long>(src.samples_in_epoch() -
                                 src.dropped_in_epoch()),
          static_cast<long long>(src.pass()),
          static_cast<long long>(src.pass_position()),
          static_cast<long long>(src.num_samples()), dropped.c_str(),
          src.stopped() ? "  (stopped: used up)" : "");
    }
  }
  return kOk;
}

}  // namespace sluice::cli
