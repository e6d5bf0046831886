// sluicectl up / demo: a local cluster of real processes, and the demo that
// exercises it (synthetic dataset, 4 trainer ranks, a trainer and a data
// server SIGKILLed mid-epoch, verification of G1-G3).
#include <archive.h>
#include <archive_entry.h>
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cli/cli.h"
#include "client/cli/local_cluster.h"
#include "client/cli/subprocess.h"
#include "nlohmann/json.hpp"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/status_macros.h"
#include "sluice/v1/coordinator.grpc.pb.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_FLAG(std::string, dir, ".sluice",
          "up/demo: working directory (journal, logs, port files; demo data).");
ABSL_FLAG(
    std::string, shards, "",
    "up: directory of shards the data servers serve (default DIR/shards).");
ABSL_FLAG(int, data_servers, 2, "up: data servers to start.");
ABSL_FLAG(std::vector<std::string>, data_server_flags, {},
          "up: flags for every data server, comma-separated (e.g. "
          "--data_server_flags=--decode_threads=1,--capacity=2).");
ABSL_FLAG(std::string, autoscale, "",
          "up: MIN:MAX -- start MIN data servers, then start and stop (drain: "
          "SIGTERM) local data servers every second to follow the "
          "coordinator's estimate of the servers the jobs need "
          "(sluice_coordinator_desired_data_servers; with "
          "--data_server_flags=--pool=NAME, that pool's), within [MIN, MAX].");
ABSL_FLAG(std::string, listen_host, "",
          "up: the host every server binds to (default: --coordinator's "
          "host). 0.0.0.0 serves other nodes: the coordinator listens on it "
          "with --coordinator's port, and data servers advertise this "
          "machine's host name.");
ABSL_FLAG(bool, ha, false,
          "up: two coordinators with their journal in a local etcd (Debian's "
          "etcd-server, `etcd` on the PATH): one leads, the other waits as a "
          "standby and takes over when the leader dies.");
ABSL_FLAG(int, demo_samples, 3002, "demo: samples in the synthetic dataset.");
ABSL_FLAG(int, demo_shards, 30, "demo: shards in the synthetic dataset.");

namespace sluice::cli {
namespace {

bool IsWildcard(const std::string& host) {
  return host == "0.0.0.0" || host == "::" || host == "[::]";
}

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

// Follows the coordinator's estimate of the data servers the jobs need
// (ListJobsResponse.desired_data_servers; that of the local servers' pool,
// given with --data_server_flags=--pool=NAME, when the coordinator sizes
// pools): starts servers up to it, drains the newest ones down to it,
// within [min, max]. The estimate already waits out bursts and lulls
// (fleet_sizer.h).
struct Autoscaler {
  int min = 0, max = 0;
  std::string pool;  // the local servers' pool ("" = the default pool)
  std::unique_ptr<v1::Coordinator::Stub> stub;
  absl::Time next_check = absl::InfinitePast();

  // False when a server could not be started (the reason printed).
  bool Tick(LocalCluster& cluster) {
    cluster.Reap();
    const absl::Time now = absl::Now();
    if (now < next_check) return true;
    next_check = now + absl::Seconds(1);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(now + absl::Seconds(2)));
    v1::ListJobsResponse listed;
    if (!stub->ListJobs(&ctx, v1::ListJobsRequest(), &listed).ok()) {
      return true;  // no answer: keep what runs
    }
    int32_t desired = listed.desired_data_servers();
    double wait_share = listed.input_wait_share();
    if (listed.pools_size() > 0) {
      desired = -1;
      for (const v1::PoolFleet& p : listed.pools()) {
        if (p.pool() != pool) continue;
        desired = p.desired_data_servers();
        wait_share = p.input_wait_share();
      }
    }
    if (desired < 0) return true;  // no estimate (yet): keep what runs
    const int target = std::clamp(static_cast<int>(desired), min, max);
    const int running = static_cast<int>(cluster.data_servers().size());
    if (target == running) return true;
    std::printf(
        "autoscale: the coordinator wants %d data servers%s%s (trainers' "
        "input wait %.0f%%); ",
        desired, pool.empty() ? "" : " in pool ", pool.c_str(),
        100 * wait_share);
    if (target > running) {
      std::printf("starting %d\n", target - running);
      std::fflush(stdout);
      while (static_cast<int>(cluster.data_servers().size()) < target) {
        if (absl::Status added = cluster.AddDataServer(); !added.ok()) {
          std::fprintf(stderr, "sluicectl up: %s\n", added.ToString().c_str());
          return false;
        }
        std::printf("data server %s\n",
                    cluster.data_servers().back().grpc_address.c_str());
      }
    } else {
      std::printf("draining %d\n", running - target);
      while (static_cast<int>(cluster.data_servers().size()) > target) {
        std::printf("data server %s draining\n",
                    cluster.DrainDataServer().c_str());
      }
    }
    std::fflush(stdout);
    return true;
  }
};

// ------------------------------------------------------------------ dataset

std::string Jpeg(int seed) {
  const int w = 64, h = 48;
  std::string rgb(static_cast<size_t>(w) * h * 3, '\0');
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<char>((x * 4 + y * 2 + seed * 37 + c * 85) & 0xff);
      }
    }
  }
  tjhandle t = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  tjCompress2(t, reinterpret_cast<const unsigned char*>(rgb.data()), w, 0, h,
              TJPF_RGB, &out, &size, TJSAMP_420, 85, 0);
  std::string jpeg(reinterpret_cast<char*>(out), size);
  tjFree(out);
  tjDestroy(t);
  return jpeg;
}

// Writes `count` samples starting at `first` as one tar (libarchive, pax).
absl::Status WriteShard(const std::string& path, int first, int count) {
  struct archive* a = archive_write_new();
  archive_write_set_format_pax_restricted(a);
  if (archive_write_open_filename(a, path.c_str()) != ARCHIVE_OK) {
    std::string error = archive_error_string(a);
    archive_write_free(a);
    return absl::InternalError("cannot write " + path + ": " + error);
  }
  for (int i = first; i < first + count; ++i) {
    char key[32];
    std::snprintf(key, sizeof(key), "sample%06d", i);
    const std::vector<std::pair<std::string, std::string>> fields = {
        {"jpg", Jpeg(i % 64)},
        {"cls", std::to_string(i % 10)},
        {"json", absl::StrCat("{\"id\":", i, "}")}};
    for (const auto& [ext, data] : fields) {
      struct archive_entry* e = archive_entry_new();
      archive_entry_set_pathname(e, absl::StrCat(key, ".", ext).c_str());
      archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, 0644);
      archive_write_header(a, e);
      archive_write_data(a, data.data(), data.size());
      archive_entry_free(e);
    }
  }
  archive_write_close(a);
  archive_write_free(a);
  return absl::OkStatus();
}

struct Delivery {
  int64_t epoch, index;
  int rank, shard;
};

// The deliveries `sluicectl read` wrote, one JSON object per line (a line
// cut short by a kill is not one, and is skipped).
std::vector<Delivery> ReadLedger(const std::string& path) {
  std::vector<Delivery> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr,
                                                   /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    const auto epoch = j.find("epoch"), rank = j.find("rank"),
               shard = j.find("shard"), index = j.find("index");
    if (epoch == j.end() || rank == j.end() || shard == j.end() ||
        index == j.end() || !epoch->is_number_integer() ||
        !rank->is_number_integer() || !shard->is_number_integer() ||
        !index->is_number_integer()) {
      continue;
    }
    Delivery d;
    d.epoch = epoch->get<int64_t>();
    d.rank = rank->get<int>();
    d.shard = shard->get<int>();
    d.index = index->get<int64_t>();
    out.push_back(d);
  }
  return out;
}

}  // namespace

int UpCommand(const std::vector<std::string>& args) {
  // After "--": the coordinator's own flags.
  for (const std::string& a : args) {
    if (a.rfind("--", 0) != 0) {
      return Usage(
          "up takes no positional arguments (coordinator flags go "
          "after --: sluicectl up -- --fleet_interval=1s)");
    }
  }
  std::optional<Autoscaler> autoscaler;
  if (const std::string spec = absl::GetFlag(FLAGS_autoscale); !spec.empty()) {
    std::vector<std::string> parts = absl::StrSplit(spec, ':');
    Autoscaler a;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &a.min) ||
        !absl::SimpleAtoi(parts[1], &a.max) || a.min < 1 || a.max < a.min) {
      return Usage("--autoscale must be MIN:MAX with 1 <= MIN <= MAX");
    }
    for (const std::string& f : absl::GetFlag(FLAGS_data_server_flags)) {
      if (absl::StartsWith(f, "--pool=")) a.pool = f.substr(7);
    }
    autoscaler = std::move(a);
  }
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::string shards = absl::GetFlag(FLAGS_shards);
  if (shards.empty()) shards = dir + "/shards";
  mkdir(dir.c_str(), 0755);
  mkdir(shards.c_str(), 0755);
  char real[PATH_MAX];
  if (realpath(shards.c_str(), real) == nullptr)
    return Fail(absl::NotFoundError("--shards: " + shards));
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  const bool ha = absl::GetFlag(FLAGS_ha);
  // The coordinator keeps --coordinator's port on --listen_host.
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const size_t colon = coordinator.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(coordinator.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return Usage("--coordinator must be HOST:PORT (the port up listens on)");
  }
  std::string host = absl::GetFlag(FLAGS_listen_host);
  if (host.empty()) host = coordinator.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const int servers = autoscaler.has_value()
                          ? autoscaler->min
                          : absl::GetFlag(FLAGS_data_servers);
  LocalCluster cluster(
      {.dir = dir,
       .bin_dir = SelfDir(),
       .shards_dir = real,
       .listen = JoinHostPort(host, port),
       .host = host,
       .coordinator_flags = args,
       .data_server_flags = absl::GetFlag(FLAGS_data_server_flags),
       .ha = ha,
       .credentials = Credentials(),
       .unset_env = {}});
  absl::Status s = cluster.StartCoordinator();
  if (s.ok()) s = cluster.StartDataServers(servers);
  if (!s.ok()) {
    cluster.Stop();
    return Fail(s);
  }
  if (ha) {
    std::printf(
        "coordinator %s (pid %d, leading; metrics %s)\n"
        "coordinator %s (pid %d, standby: takes over if the leader dies)\n"
        "clients: --coordinator=%s\n",
        cluster.coordinator().grpc_address.c_str(),
        static_cast<int>(cluster.coordinator().process.pid()),
        cluster.coordinator().metrics_address.c_str(),
        cluster.standby().grpc_address.c_str(),
        static_cast<int>(cluster.standby().process.pid()),
        cluster.coordinator_address().c_str());
  } else {
    std::printf("coordinator %s (metrics %s)\n",
                cluster.coordinator_address().c_str(),
                cluster.coordinator().metrics_address.c_str());
  }
  for (const ServerProcess& d : cluster.data_servers())
    std::printf("data server %s\n", d.grpc_address.c_str());
  if (IsWildcard(host)) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    const std::string bound = cluster.coordinator().grpc_address;
    std::printf("other nodes: --coordinator=%s\n",
                JoinHostPort(
                    name, std::atoi(bound.substr(bound.rfind(':') + 1).c_str()))
                    .c_str());
  }
  std::printf("shards from %s; logs in %s/logs; Ctrl-C stops everything\n",
              real, dir.c_str());
  if (autoscaler.has_value()) {
    autoscaler->stub = v1::Coordinator::NewStub(
        CoordinatorChannel(cluster.coordinator_address(), Credentials()));
    std::printf(
        "autoscale: %d to %d data servers, following the coordinator's "
        "estimate\n",
        autoscaler->min, autoscaler->max);
  }
  std::fflush(stdout);
  bool leader_gone = false;
  while (!g_stop) {
    if (!leader_gone && cluster.coordinator().process.Poll()) {
      if (!ha) {
        std::fprintf(stderr,
                     "sluicectl up: the coordinator exited; stopping\n");
        break;
      }
      leader_gone = true;
      std::fprintf(stderr,
                   "sluicectl up: coordinator %s exited; %s takes over\n",
                   cluster.coordinator().grpc_address.c_str(),
                   cluster.standby().grpc_address.c_str());
    }
    if (ha && cluster.standby().process.Poll()) {
      std::fprintf(stderr, "sluicectl up: coordinator %s exited; stopping\n",
                   cluster.standby().grpc_address.c_str());
      break;
    }
    if (autoscaler.has_value() && !autoscaler->Tick(cluster)) break;
    absl::SleepFor(absl::Milliseconds(100));  // wait for Ctrl-C
  }
  cluster.Stop();
  return kOk;
}

int DemoCommand(const std::vector<std::string>& args) {
  if (!args.empty()) return Usage("demo takes no positional arguments");
  const absl::Time started = absl::Now();
  const std::string dir = absl::GetFlag(FLAGS_dir) + "/demo";
  const int total = absl::GetFlag(FLAGS_demo_samples);
  const int num_shards = absl::GetFlag(FLAGS_demo_shards);
  const int world = 4, epochs = 2;
  if (total < 100 * world || num_shards < 2)
    return Usage("--demo_samples >= 400, --demo_shards >= 2");
  // A fresh directory every run.
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir + "/shards", ec);
  if (ec)
    return Fail(absl::InternalError("cannot create " + dir +
                                    "/shards: " + ec.message()));
  char real[PATH_MAX];
  if (realpath(dir.c_str(), real) == nullptr)
    return Fail(absl::InternalError("cannot create " + dir));
  const std::string root = real;
  const bool tty = isatty(STDERR_FILENO);

  // 1. A synthetic WebDataset: JPEG + cls + json samples.
  std::fprintf(stderr,
               "[1/5] writing %d samples in %d shards under %s/shards\n", total,
               num_shards, root.c_str());
  nlohmann::ordered_json manifest;
  manifest["shards"] = nlohmann::ordered_json::array();
  std::vector<int> sizes;
  for (int i = 0, first = 0; i < num_shards; ++i) {
    int count = total / num_shards + (i < total % num_shards ? 1 : 0);
    std::string path = absl::StrCat(root, "/shards/demo-", i, ".tar");
    absl::Status s = WriteShard(path, first, count);
    if (!s.ok()) return Fail(s);
    struct stat st;
    stat(path.c_str(), &st);
    manifest["shards"].push_back(
        {{"url", path}, {"num_samples", count}, {"size_bytes", st.st_size}});
    sizes.push_back(count);
    first += count;
  }
  std::ofstream(root + "/manifest.json") << manifest.dump(1) << "\n";

  // 2. Coordinator + 2 data servers.
  std::fprintf(stderr, "[2/5] starting a coordinator and 2 data servers\n");
  LocalClusterOptions options;
  options.dir = root;
  options.bin_dir = SelfDir();
  options.shards_dir = root + "/shards";
  options.coordinator_flags = {"--heartbeat_interval=250ms"};
  options.data_server_flags = absl::GetFlag(FLAGS_data_server_flags);
  LocalCluster cluster(std::move(options));
  absl::Status started_cluster = cluster.StartCoordinator();
  if (started_cluster.ok()) started_cluster = cluster.StartDataServers(2);
  if (!started_cluster.ok()) {
    cluster.Stop();
    return Fail(started_cluster);
  }
  const std::string self = SelfPath();
  auto run_ctl = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {self};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("--coordinator=" + cluster.coordinator_address());
    auto p =
        Subprocess::Spawn(argv, root + "/logs/ctl.out", root + "/logs/ctl.log");
    return p.ok() ? p->Wait(absl::Seconds(30))
                  : absl::StatusOr<int>(p.status());
  };
  auto created = run_ctl(
      {"job", "create", "--name=demo", "--manifest=" + root + "/manifest.json",
       "--world_size=4", "--epochs=2", "--seed=7", "--lease_ttl=2s"});
  if (!created.ok() || *created != 0) {
    cluster.Stop();
    return Fail(absl::InternalError("job create failed; see " + root +
                                    "/logs/ctl.log"));
  }

  // 3. Four trainer ranks, each `sluicectl read` writing one line per sample.
  struct Trainer {
    int rank;
    std::string ledger;
    Subprocess process;
    bool killed = false;
  };
  std::vector<Trainer> trainers;
  auto start_trainer = [&](int rank, const std::string& tag) -> absl::Status {
    Trainer t;
    t.rank = rank;
    t.ledger = absl::StrCat(root, "/trainer-", rank, tag, ".jsonl");
    ASSIGN_OR_RETURN(
        t.process,
        Subprocess::Spawn(
            {self, "read", "--job=demo", absl::StrCat("--rank=", rank),
             "--coordinator=" + cluster.coordinator_address(), "--rate=600",
             "--progress_interval=200ms"},
            t.ledger, absl::StrCat(root, "/logs/trainer-", rank, tag, ".log")));
    trainers.push_back(std::move(t));
    return absl::OkStatus();
  };
  std::fprintf(stderr,
               "[3/5] running 4 ranks x 2 epochs; a trainer and a data server "
               "will be SIGKILLed\n");
  for (int r = 0; r < world; ++r) {
    absl::Status s = start_trainer(r, "");
    if (!s.ok()) return Fail(s);
  }
  const int64_t per_rank = total / world;
  const int64_t per_epoch = per_rank * world;
  bool trainer_killed = false, server_killed = false;
  std::string killed_ledger;
  std::vector<std::string> events;
  absl::Time last_line = absl::InfinitePast();
  const absl::Time deadline = absl::Now() + absl::Seconds(100);
  while (true) {
    std::map<int64_t, int64_t> by_epoch;
    int64_t rank1_epoch0 = 0;
    for (const Trainer& t : trainers) {
      for (const Delivery& d : ReadLedger(t.ledger)) {
        ++by_epoch[d.epoch];
        if (&t == &trainers[1] && d.epoch == 0) ++rank1_epoch0;
      }
    }
    if (!trainer_killed && rank1_epoch0 >= per_rank * 2 / 5) {
      trainers[1].process.Signal(SIGKILL);
      (void)trainers[1].process.Wait(absl::Seconds(5));
      trainers[1].killed = true;
      killed_ledger = trainers[1].ledger;
      trainer_killed = true;
      events.push_back(
          absl::StrCat("SIGKILLed rank 1's trainer after ", rank1_epoch0,
                       " samples of epoch 0; started a replacement"));
      absl::Status s = start_trainer(1, "-replacement");
      if (!s.ok()) return Fail(s);
    }
    if (trainer_killed && !server_killed && by_epoch[1] >= per_epoch / 2) {
      cluster.data_servers()[1].process.Kill();
      server_killed = true;
      events.push_back(absl::StrCat(
          "SIGKILLed data server ", cluster.data_servers()[1].grpc_address,
          " after ", by_epoch[1], " samples of epoch 1"));
    }
    int64_t done =
        std::min(by_epoch[0], per_epoch) + std::min(by_epoch[1], per_epoch);
    int pct = static_cast<int>(100 * done / (per_epoch * epochs));
    if (tty) {
      int bar = pct * 30 / 100;
      std::fprintf(
          stderr, "\r  [%s%s] %3d%%  epoch 0: %lld/%lld  epoch 1: %lld/%lld ",
          std::string(bar, '#').c_str(), std::string(30 - bar, ' ').c_str(),
          pct, static_cast<long long>(by_epoch[0]),
          static_cast<long long>(per_epoch),
          static_cast<long long>(by_epoch[1]),
          static_cast<long long>(per_epoch));
    } else if (absl::Now() - last_line > absl::Seconds(2)) {
      std::fprintf(stderr, "  %3d%%  epoch 0: %lld/%lld  epoch 1: %lld/%lld\n",
                   pct, static_cast<long long>(by_epoch[0]),
                   static_cast<long long>(per_epoch),
                   static_cast<long long>(by_epoch[1]),
                   static_cast<long long>(per_epoch));
      last_line = absl::Now();
    }
    bool running = false;
    for (Trainer& t : trainers)
      running |= !t.killed && !t.process.Poll().has_value();
    if (!running) break;
    if (absl::Now() > deadline) {
      std::fprintf(stderr,
                   "\nsluicectl demo: trainers still running after 100 s\n");
      cluster.Stop();
      return kVerifyFailed;
    }
    absl::SleepFor(absl::Milliseconds(50));  // monitoring interval
  }
  if (tty) std::fprintf(stderr, "\n");
  for (const std::string& e : events) std::fprintf(stderr, "  %s\n", e.c_str());
  int failed_trainers = 0;
  for (Trainer& t : trainers) {
    if (!t.killed && t.process.Poll().value_or(1) != 0) ++failed_trainers;
  }

  // 4. Verify.
  std::fprintf(stderr, "[4/5] verifying\n");
  // The job's lease outcomes, as the coordinator counts them.
  v1::LeaseCounts leases;
  {
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(cluster.coordinator().grpc_address,
                            grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::GetJobRequest request;
    request.set_name("demo");
    v1::Job job;
    grpc::Status s = stub->GetJob(&ctx, request, &job);
    if (s.ok()) {
      leases = job.status().leases();
    } else {
      std::fprintf(stderr, "sluicectl demo: GetJob demo: %s\n",
                   s.error_message().c_str());
    }
  }
  std::map<std::tuple<int64_t, int, int64_t>, std::vector<std::string>> seen;
  std::map<std::pair<int64_t, int>, std::set<std::pair<int, int64_t>>>
      unique_by_rank;
  bool in_dataset = true;
  for (const Trainer& t : trainers) {
    for (const Delivery& d : ReadLedger(t.ledger)) {
      seen[{d.epoch, d.shard, d.index}].push_back(t.ledger);
      unique_by_rank[{d.epoch, d.rank}].insert({d.shard, d.index});
      in_dataset &= d.shard >= 0 && d.shard < num_shards && d.index >= 0 &&
                    d.index < sizes[d.shard];
    }
  }
  bool ok =
      in_dataset && failed_trainers == 0 && trainer_killed && server_killed;
  std::printf(
      "\nSluice demo: %d samples in %d shards, world size %d, %d epochs, drop "
      "remainder (%lld per epoch)\n",
      total, num_shards, world, epochs,
      static_cast<long long>(total - per_epoch));
  for (int e = 0; e < epochs; ++e) {
    std::string line = absl::StrCat("  epoch ", e, ": samples per rank");
    int64_t unique = 0;
    for (int r = 0; r < world; ++r) {
      int64_t n = static_cast<int64_t>(unique_by_rank[{e, r}].size());
      absl::StrAppend(&line, " ", n);
      unique += n;
      ok &= n == per_rank;
    }
    int64_t dup = 0;
    bool dup_from_killed = true;
    for (const auto& [key, who] : seen) {
      if (std::get<0>(key) != e || who.size() < 2) continue;
      dup += static_cast<int64_t>(who.size()) - 1;
      dup_from_killed &= who.size() == 2 &&
                         (who[0] == killed_ledger || who[1] == killed_ledger);
    }
    ok &= unique == per_epoch && dup_from_killed;
    // G2's bound: a killed trainer re-delivers at most what it delivered
    // since its last report: rate x progress interval (600/s x 0.2 s), twice
    // for the reporting tick's slack.
    bool within_bound = dup <= 600 * 2 / 5;
    ok &= within_bound;
    absl::StrAppend(&line,
                    unique == per_epoch ? " (all equal to " : " (expected ",
                    per_rank, ")");
    std::printf("%s\n", line.c_str());
    std::printf(
        "    distinct samples delivered: %lld of %lld (every sample of the "
        "epoch exactly once%s)\n",
        static_cast<long long>(unique), static_cast<long long>(per_epoch),
        unique == per_epoch ? "" : ": MISSING SAMPLES");
    std::printf("    delivered twice: %lld (bound %d)%s\n",
                static_cast<long long>(dup), 600 * 2 / 5,
                dup == 0          ? ""
                : dup_from_killed ? " (all received by the killed trainer but "
                                    "not yet acknowledged, G2)"
                                  : " (NOT explained by the killed trainer)");
  }
  std::printf(
      "  leases granted %lld, expired %lld (the killed trainer's), re-routed "
      "or released %lld\n",
      static_cast<long long>(leases.granted()),
      static_cast<long long>(leases.expired()),
      static_cast<long long>(leases.returned()));
  ok &= leases.expired() >= 1;

  std::printf(
      "  data server killed: %s; trainer killed: %s; trainers that failed: "
      "%d\n",
      server_killed ? "yes" : "no", trainer_killed ? "yes" : "no",
      failed_trainers);

  std::fprintf(stderr, "[5/5] stopping the cluster\n");
  cluster.Stop();
  std::printf("%s in %.1f s (logs and ledgers in %s)\n",
              ok ? "VERIFIED" : "VERIFICATION FAILED",
              absl::ToDoubleSeconds(absl::Now() - started), root.c_str());
  return ok ? kOk : kVerifyFailed;
}

}  // namespace sluice::cli
