// Coordinator benchmark (make bench; not a test).
//
// --mode=leases: the real sluice-coordinator binary (journal on disk) and N
// concurrent sessions over gRPC, each holding one 1-sample lease at a time:
// Grant -> Progress -> Complete -> next Grant, as the issue specifies (with
// --progress=false: Grant -> Complete; a real trainer on a 1-sample unit
// sends only the Complete). The coordinator journals the Progress (an
// acknowledgement) and the Complete. Two phases: saturation (every session
// completes at once: lease operations per second = grants + completions), and a
// paced load of
// --paced_ops_per_s spread evenly over the sessions, where the grant
// latency (Complete sent -> next Grant received) p50/p99 is measured; in a
// saturated closed loop latency is only sessions / throughput. Baseline,
// same run, same load generator: a bare gRPC bidi server in this process
// that answers every Complete with a canned Grant (no state, no journal)
// and receives the Progress messages without answering, as the coordinator.
//
// --mode=plan: CreateJob of a 1,000,000-shard manifest on an in-process
// CoordinatorService with a file journal: wall time and peak memory per
// shard (peak RSS growth over the process before the call, the request
// itself excluded). Baseline: parsing the same manifest's serialized bytes
// (the least any coordinator must do with it).
//
// --mode=etcd: the same lease load on two real sluice-coordinator
// binaries, one with its journal in etcd (a real single-member etcd started
// here) and, as the baseline, one with the local file journal: saturated
// rate and grant latency paced at --etcd_paced_ops_per_s. Then failover: a
// standby coordinator on the same etcd prefix, the leader SIGKILLed, and the
// time until a trainer's Session on the standby receives its first Grant.
//
// --sources=N adds, in leases mode, the same load on a job mixing N sources
// (the manifest split evenly, equal weights) next to the one-manifest job,
// and in plan mode CreateJob of the 1,000,000 shards as N sources next to
// one manifest.
//
// --mode=open: one job of R ranks x --workers DataLoader workers (R x W
// sessions, for each size in --open_sessions), opened at once against the
// real sluice-coordinator binary, as a large training job starts: each
// session sends Hello{rank, worker, num_workers} and Want{2} and holds the
// grants it gets, heartbeating as Welcome asks. Per size: the time until
// every session has its EpochBegin, the coordinator's CPU seconds while
// they open, its CPU per idle session per second over the next
// --idle_seconds (heartbeats only), its RSS growth per session, the
// leases that expired meanwhile, and then, with the sessions completing one
// lease each in turn at --open_paced_grants_per_s for --paced_seconds, its
// CPU per grant beyond the idle rate (the mean of the idle rates measured
// before and after it; against the first size's: the cost per grant should
// not grow with the job) and the grant latency (Complete sent -> next Grant
// received); over all of it, the coordinator's lock holds from its own
// histograms (wall and CPU time), and a registered data server's heartbeat
// acknowledgements (never later than its timeout, or the coordinator took
// it for dead). Baseline, same run: a bare gRPC server
// (this binary, --mode=echo_server, in its own process with the
// coordinator's jemalloc) that answers each Hello with Welcome and
// EpochBegin and each Want credit and Complete with a canned Grant (no
// state, no journal), under the same load generator, heartbeats and paced
// phase: its open time, its RSS growth per session (what gRPC's own
// per-stream state costs) and its CPU per grant against its own at the
// first size (how much of the growth with the job is gRPC's alone).
//
// --mode=remote_grants --coordinator=ADDR --baseline=ADDR: the leases
// mode's paced load (--sessions, --paced_ops_per_s, --seconds, --rounds)
// against a coordinator that runs elsewhere (another host: what a trainer
// across a network sees), and against the same bare gRPC server as leases
// mode in a process of its own at ADDR (--mode=grant_echo_server
// --listen=HOST:0 --port_file=F), on the same hosts and links: grant latency
// p50/p99 of each, alternating rounds, medians.
//
// Each mode ends with one JSON line.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/open_journal.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "tests/testing/coordinator_client.h"
#include "tests/testing/etcd.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(std::string, mode, "leases",
          "leases | plan | compaction | etcd | open (echo_server: open's "
          "baseline server, "
          "started by open mode itself)");
ABSL_FLAG(std::string, port_file, "",
          "echo_server and grant_echo_server modes: where to write "
          "grpc=ADDRESS once listening.");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "grant_echo_server mode: the address to listen on (port 0: any).");
ABSL_FLAG(std::string, coordinator, "",
          "remote_grants mode: a running sluice-coordinator's address.");
ABSL_FLAG(std::string, baseline, "",
          "remote_grants mode: a grant_echo_server's address.");
ABSL_FLAG(int, sessions, 256, "Concurrent sessions (leases mode).");
ABSL_FLAG(double, seconds, 5, "Measured seconds per round (leases mode).");
ABSL_FLAG(int, rounds, 3,
          "Alternating rounds of Sluice and the baseline (leases mode).");
ABSL_FLAG(double, paced_ops_per_s, 50000,
          "Grants+completions per second of the paced phase (leases mode).");
ABSL_FLAG(double, etcd_paced_ops_per_s, 10000,
          "Paced load for grant latency (etcd mode).");
ABSL_FLAG(absl::Duration, election_ttl, absl::Seconds(2),
          "The coordinators' --election_ttl (etcd mode).");
ABSL_FLAG(int, shards, 1000000, "Manifest size (plan mode).");
ABSL_FLAG(int, sources, 0,
          "Also measure a job mixing this many sources, of the same shards "
          "split evenly and equal weights, next to the one-manifest job "
          "(leases and plan modes).");
ABSL_FLAG(int, shuffle_window, 0,
          "leases mode: also drive a shuffled job with this shuffle_window "
          "(every grant then names the window's shards) in the same rounds, "
          "and report its rate next to the unshuffled job's (0 = off).");
ABSL_FLAG(std::vector<std::string>, open_sessions,
          std::vector<std::string>({"256", "1024", "4096", "8192", "16384"}),
          "Session counts (ranks x --workers) to open (open mode).");
ABSL_FLAG(int, workers, 8, "DataLoader workers per rank (open mode).");
ABSL_FLAG(double, idle_seconds, 5,
          "Seconds of heartbeats only after the open, and again after the "
          "paced phase (open mode).");
ABSL_FLAG(double, open_paced_grants_per_s, 300,
          "Grants per second of the paced phase after the idle one: a "
          "session completes one of its leases (Progress + Complete) and gets "
          "the next (open mode).");
ABSL_FLAG(double, paced_seconds, 10, "Seconds of the paced phase (open mode).");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000,
          "echo_server mode: the heartbeat interval its Welcome asks for "
          "(open mode passes the coordinator's, so that both carry the same "
          "heartbeats).");
ABSL_FLAG(int, echo_servers, 1,
          "open mode: run its bare gRPC baseline as this many gRPC servers "
          "on one port (SO_REUSEPORT; the kernel spreads the connections), "
          "each with its own callback completion queue.");
ABSL_FLAG(bool, progress, true,
          "Leases mode: a Progress before every Complete (Grant -> Progress -> "
          "Complete).");

namespace {

using sluice::v1::CoordinatorMessage;
using sluice::v1::TrainerMessage;

// ------------------------------------------------------------ load generator

struct Totals {
  std::atomic<int64_t> grants{0};
  std::atomic<int64_t> completes{0};
  std::atomic<bool> measuring{false};
  absl::Mutex mu;
  std::vector<double> latencies_us;  // while measuring
};

// A trainer's Session stream from the load generator: messages are queued
// and written one at a time, in order. Subclasses read (OnReadDone) and may
// watch each write start and finish.
class QueuedSession
    : public grpc::ClientBidiReactor<TrainerMessage, CoordinatorMessage> {
 public:
  // Queues `ms` in order (nothing after Stop).
  void Enqueue(std::vector<TrainerMessage> ms) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    for (TrainerMessage& m : ms) queue_.push_back(std::move(m));
    if (!writing_) StartNextLocked();
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      writing_ = false;
      return;
    }
    Written(queue_[next_]);
    if (++next_ < queue_.size()) {
      StartNextLocked();
    } else {
      writing_ = false;
      queue_.clear();
      next_ = 0;
    }
  }
  void OnDone(const grpc::Status&) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
    }
    ctx_.TryCancel();
    RemoveHold();
  }
  bool done() {
    absl::MutexLock lock(&mu_);
    return done_;
  }

 protected:
  // Opens the stream with `first` queued (Hello, Want).
  void Begin(sluice::v1::Coordinator::Stub* stub,
             std::vector<TrainerMessage> first) {
    absl::MutexLock lock(&mu_);
    queue_ = std::move(first);
    stub->async()->Session(&ctx_, this);
    StartRead(&in_);
    writing_ = true;
    StartWrite(&queue_[0]);
    AddHold();  // released in Stop
    StartCall();
  }
  // Each write, as it starts and once it is done (under the queue's lock).
  virtual void Writing() {}
  virtual void Written(const TrainerMessage&) {}

  CoordinatorMessage in_;

 private:
  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_ = true;
    Writing();
    StartWrite(&queue_[next_]);
  }

  grpc::ClientContext ctx_;
  absl::Mutex mu_;
  std::vector<TrainerMessage> queue_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

class Session;

// Sends paced Completes when they are due (one thread for all sessions).
class Pacer {
 public:
  Pacer() : thread_([this] { Run(); }) {}
  ~Pacer() { Stop(); }
  // No more Writes after this returns (At() still queues, harmlessly).
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void At(absl::Time due, Session* s, std::vector<TrainerMessage> ms) {
    absl::MutexLock lock(&mu_);
    due_.emplace(due, std::make_pair(s, std::move(ms)));
  }

 private:
  void Run();
  absl::Mutex mu_;
  std::multimap<absl::Time, std::pair<Session*, std::vector<TrainerMessage>>>
      due_;
  bool stop_ = false;
  std::thread thread_;
};

// One trainer session: Hello, Want{1}, then Complete every Grant, at once
// or (with a pacer) every `interval`.
class Session : public QueuedSession {
 public:
  Session(sluice::v1::Coordinator::Stub* stub, const std::string& job, int id,
          Totals* totals, Pacer* pacer, absl::Duration interval)
      : totals_(totals), pacer_(pacer), interval_(interval) {
    TrainerMessage hello;
    hello.mutable_hello()->set_job(job);
    hello.mutable_hello()->set_trainer_id(absl::StrCat("bench-", id));
    TrainerMessage want;
    want.mutable_want()->set_credits(1);
    Begin(stub, {hello, want});
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_grant()) {
      const absl::Time now = absl::Now();
      if (totals_->measuring.load(std::memory_order_relaxed)) {
        totals_->grants.fetch_add(1, std::memory_order_relaxed);
        const int64_t sent = sent_at_ns_.load();
        if (sent != kNotSent) {
          absl::MutexLock lock(&totals_->mu);
          totals_->latencies_us.push_back(
              absl::ToDoubleMicroseconds(now - absl::FromUnixNanos(sent)));
        }
      }
      std::vector<TrainerMessage> reports;
      if (progress_) {
        TrainerMessage& progress = reports.emplace_back();
        progress.mutable_progress()->mutable_lease()->set_lease_id(
            in_.grant().lease().lease_id());
        progress.mutable_progress()->mutable_lease()->set_fence(
            in_.grant().lease().fence());
        progress.mutable_progress()->set_consumed(1);
      }
      TrainerMessage& complete = reports.emplace_back();
      complete.mutable_complete()->mutable_lease()->set_lease_id(
          in_.grant().lease().lease_id());
      complete.mutable_complete()->mutable_lease()->set_fence(
          in_.grant().lease().fence());
      if (pacer_ != nullptr) {
        next_due_ = std::max(next_due_ + interval_, now);
        pacer_->At(next_due_, this, std::move(reports));
      } else {
        Enqueue(std::move(reports));
      }
    }
    StartRead(&in_);
  }

 private:
  // Latency is measured from the start of the last write before a Grant.
  void Writing() override { sent_at_ns_.store(absl::GetCurrentTimeNanos()); }
  void Written(const TrainerMessage& m) override {
    if (m.has_complete() &&
        totals_->measuring.load(std::memory_order_relaxed)) {
      totals_->completes.fetch_add(1, std::memory_order_relaxed);
    }
  }

  Totals* totals_;
  Pacer* pacer_;
  const absl::Duration interval_;
  const bool progress_ = absl::GetFlag(FLAGS_progress);
  absl::Time next_due_ = absl::Now();  // reads are serialized
  static constexpr int64_t kNotSent = INT64_MIN;
  std::atomic<int64_t> sent_at_ns_{kNotSent};
};

void Pacer::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const absl::Time now = absl::Now();
    while (!due_.empty() && due_.begin()->first <= now) {
      auto [s, m] = std::move(due_.begin()->second);
      due_.erase(due_.begin());
      mu_.Unlock();
      s->Enqueue(std::move(m));
      mu_.Lock();
    }
    const absl::Time next =
        due_.empty() ? now + absl::Milliseconds(1) : due_.begin()->first;
    mu_.AwaitWithDeadline(absl::Condition(&stop_),
                          std::min(next, now + absl::Milliseconds(1)));
  }
}

// `n` stubs on distinct connections to `address` (not one shared
// subchannel).
std::vector<std::unique_ptr<sluice::v1::Coordinator::Stub>> Stubs(
    const std::string& address, int n) {
  std::vector<std::unique_ptr<sluice::v1::Coordinator::Stub>> stubs;
  for (int i = 0; i < n; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", i);
    stubs.push_back(sluice::v1::Coordinator::NewStub(grpc::CreateCustomChannel(
        address, grpc::InsecureChannelCredentials(), args)));
  }
  return stubs;
}

struct LeaseRate {
  double ops_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
};

// `paced_ops_per_s` 0 = saturate (closed loop).
LeaseRate Drive(const std::string& address, const std::string& job,
                int sessions, double seconds, double paced_ops_per_s) {
  // A few connections, as several trainer processes would have.
  auto stubs = Stubs(address, 4);
  Totals totals;
  std::unique_ptr<Pacer> pacer;
  absl::Duration interval;
  if (paced_ops_per_s > 0) {
    pacer = std::make_unique<Pacer>();
    interval =
        absl::Seconds(2.0 * sessions / paced_ops_per_s);  // 2 ops per lease
  }
  std::vector<std::unique_ptr<Session>> all;
  for (int i = 0; i < sessions; ++i) {
    all.push_back(std::make_unique<Session>(stubs[i % stubs.size()].get(), job,
                                            i, &totals, pacer.get(), interval));
  }
  absl::SleepFor(
      absl::Seconds(1));  // warm-up: every session connected and cycling
  totals.measuring = true;
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(seconds));
  totals.measuring = false;
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  if (pacer != nullptr) pacer->Stop();
  for (auto& s : all) s->Stop();
  for (auto& s : all) {
    while (!s->done())
      absl::SleepFor(absl::Milliseconds(1));  // reactor teardown
  }
  all.clear();
  pacer.reset();
  LeaseRate rate;
  rate.ops_per_s =
      static_cast<double>(totals.grants + totals.completes) / elapsed;
  std::vector<double>& l = totals.latencies_us;
  if (!l.empty()) {
    std::sort(l.begin(), l.end());
    rate.p50_us = l[l.size() / 2];
    rate.p99_us = l[std::min(l.size() - 1, l.size() * 99 / 100)];
  }
  return rate;
}

// ------------------------------------------------------------ baseline server

// Bare gRPC: every Want credit and every Complete is answered with a canned
// Grant of the size the coordinator sends. No state, no journal.
class EchoSession
    : public grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage> {
 public:
  explicit EchoSession(const CoordinatorMessage* grant) : grant_(grant) {
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    const bool answer = in_.has_complete() || in_.has_want();
    {
      absl::MutexLock lock(&mu_);
      if (answer) {
        if (writing_) {
          ++owed_;
        } else {
          writing_ = true;
          StartWrite(grant_);
        }
      }
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok && owed_ > 0) {
      --owed_;
      StartWrite(grant_);
    } else {
      writing_ = false;
    }
  }
  void OnDone() override { delete this; }

 private:
  const CoordinatorMessage* grant_;
  TrainerMessage in_;
  absl::Mutex mu_;
  bool writing_ = false;
  int owed_ = 0;
};

class EchoService : public sluice::v1::Coordinator::CallbackService {
 public:
  explicit EchoService(CoordinatorMessage grant) : grant_(std::move(grant)) {}
  grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage>* Session(
      grpc::CallbackServerContext*) override {
    return new EchoSession(&grant_);
  }

 private:
  const CoordinatorMessage grant_;
};

// A baseline server in this process on `listen` (HOST:PORT, port 0 for one
// of its choosing); `address` gets "HOST:PORT".
std::unique_ptr<grpc::Server> Serve(grpc::Service* service,
                                    std::string* address,
                                    const std::string& listen = "127.0.0.1:0") {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return nullptr;
  *address = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  return server;
}

// The Grant the baseline answers with: one 1-sample lease, the size of the
// coordinator's.
CoordinatorMessage CannedGrant() {
  CoordinatorMessage sample_grant;
  sluice::v1::Lease* lease = sample_grant.mutable_grant()->mutable_lease();
  lease->set_lease_id("bench/e0/f123456");
  lease->set_fence(123456);
  lease->set_job("bench");
  lease->set_rank(-1);
  lease->mutable_unit()->mutable_shard()->set_url("/data/bench/shard-517.tar");
  lease->mutable_unit()->mutable_shard()->set_shard_index(517);
  lease->mutable_unit()->set_begin(611);
  lease->mutable_unit()->set_end(612);
  lease->mutable_unit()->set_sequence(517611);
  lease->set_expires_at_unix_ms(absl::ToUnixMillis(absl::Now()));
  return sample_grant;
}

// `spec`'s shards as `sources` sources of about equal size, equal weights,
// and the same samples per epoch.
sluice::v1::JobSpec MixedSpec(const sluice::v1::JobSpec& spec,
                              const std::string& name, int sources) {
  sluice::v1::JobSpec mixed = spec;
  mixed.set_name(name);
  mixed.clear_manifest();
  int64_t total = 0;
  const int shards = spec.manifest().shards_size();
  for (int k = 0; k < sources; ++k) {
    sluice::v1::Source* src = mixed.add_sources();
    src->set_name(absl::StrCat("source-", k));
    src->set_weight(1);
    for (int s = k * shards / sources; s < (k + 1) * shards / sources; ++s) {
      *src->mutable_manifest()->add_shards() = spec.manifest().shards(s);
      total += spec.manifest().shards(s).num_samples();
    }
  }
  mixed.set_samples_per_epoch(total);
  return mixed;
}

// The real sluice-coordinator binary with its journal in `dir`, granting
// without data servers; a failure to start is printed.
absl::StatusOr<sluice::testing::ServerProcess> StartCoordinator(
    const sluice::testing::TempDir& dir) {
  auto coordinator =
      sluice::testing::StartServer("sluice-coordinator", dir.path(),
                                   {"--wait_for_data_servers=false",
                                    "--journal_dir=" + dir.File("journal")});
  if (!coordinator.ok()) {
    std::fprintf(stderr, "%s\n", coordinator.status().ToString().c_str());
  }
  return coordinator;
}

int RunLeases() {
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  sluice::testing::TempDir dir;
  auto coordinator = StartCoordinator(dir);
  if (!coordinator.ok()) return 1;
  // An endless job of 1-sample units, no quotas: any session takes any unit.
  {
    sluice::v1::JobSpec spec;
    spec.set_name("bench");
    for (int s = 0; s < 1000; ++s) {
      auto* shard = spec.mutable_manifest()->add_shards();
      shard->set_url(absl::StrCat("/data/bench/shard-", s, ".tar"));
      shard->set_num_samples(1000);
    }
    spec.set_max_samples_per_lease(1);
    spec.set_world_size(0);
    spec.set_num_epochs(0);
    absl::Status created =
        sluice::testing::CreateJob(coordinator->grpc_address, spec);
    if (created.ok() && absl::GetFlag(FLAGS_sources) > 0) {
      created = sluice::testing::CreateJob(
          coordinator->grpc_address,
          MixedSpec(spec, "bench-mix", absl::GetFlag(FLAGS_sources)));
    }
    if (created.ok() && absl::GetFlag(FLAGS_shuffle_window) > 0) {
      spec.set_name("bench-window");
      spec.set_shuffle(true);
      spec.set_shuffle_window(absl::GetFlag(FLAGS_shuffle_window));
      created = sluice::testing::CreateJob(coordinator->grpc_address, spec);
    }
    if (!created.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", created.ToString().c_str());
      return 1;
    }
  }
  EchoService echo(CannedGrant());
  std::string echo_address;
  std::unique_ptr<grpc::Server> echo_server = Serve(&echo, &echo_address);

  const double paced = absl::GetFlag(FLAGS_paced_ops_per_s);
  std::vector<LeaseRate> sluice_rates, bare_rates, sluice_paced, bare_paced,
      window_rates, mix_rates;
  const bool windows = absl::GetFlag(FLAGS_shuffle_window) > 0;
  const int mix_sources = absl::GetFlag(FLAGS_sources);
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    bare_rates.push_back(Drive(echo_address, "bench", sessions, seconds, 0));
    sluice_rates.push_back(
        Drive(coordinator->grpc_address, "bench", sessions, seconds, 0));
    if (windows) {
      window_rates.push_back(Drive(coordinator->grpc_address, "bench-window",
                                   sessions, seconds, 0));
      std::fprintf(stderr,
                   "round %d: saturated, shuffle window of %d shards: %.0f "
                   "ops/s\n",
                   r, absl::GetFlag(FLAGS_shuffle_window),
                   window_rates.back().ops_per_s);
    }
    if (mix_sources > 0) {
      mix_rates.push_back(
          Drive(coordinator->grpc_address, "bench-mix", sessions, seconds, 0));
      std::fprintf(stderr,
                   "round %d: saturated, %d sources mixed: %.0f ops/s\n", r,
                   mix_sources, mix_rates.back().ops_per_s);
    }
    bare_paced.push_back(
        Drive(echo_address, "bench", sessions, seconds, paced));
    sluice_paced.push_back(
        Drive(coordinator->grpc_address, "bench", sessions, seconds, paced));
    std::fprintf(stderr,
                 "round %d: saturated sluice %.0f ops/s, bare gRPC %.0f; paced "
                 "sluice %.0f ops/s "
                 "grant p99 %.2f ms, bare gRPC %.0f ops/s p99 %.2f ms\n",
                 r, sluice_rates.back().ops_per_s, bare_rates.back().ops_per_s,
                 sluice_paced.back().ops_per_s,
                 sluice_paced.back().p99_us / 1000, bare_paced.back().ops_per_s,
                 bare_paced.back().p99_us / 1000);
  }
  auto median = [](std::vector<LeaseRate> v) {
    std::sort(v.begin(), v.end(), [](const LeaseRate& a, const LeaseRate& b) {
      return a.ops_per_s < b.ops_per_s;
    });
    return v[v.size() / 2];
  };
  const LeaseRate s = median(sluice_rates), b = median(bare_rates);
  auto by_p99 = [](std::vector<LeaseRate> v) {
    std::sort(v.begin(), v.end(), [](const LeaseRate& a, const LeaseRate& b) {
      return a.p99_us < b.p99_us;
    });
    return v[v.size() / 2];
  };
  const LeaseRate sp = by_p99(sluice_paced), bp = by_p99(bare_paced);
  const double ratio = s.ops_per_s / b.ops_per_s;
  const bool progress = absl::GetFlag(FLAGS_progress);
  std::printf(
      "coordinator leases (%d sessions, Grant -> %sComplete): saturated %.0f "
      "grants+completions/s (bare gRPC %.0f, ratio %.2f); paced at %.0f ops/s "
      "(bare gRPC "
      "%.0f): grant latency p50 %.2f ms p99 %.2f ms (bare gRPC p50 %.2f ms p99 "
      "%.2f ms)\n",
      sessions, progress ? "Progress -> " : "", s.ops_per_s, b.ops_per_s, ratio,
      sp.ops_per_s, bp.ops_per_s, sp.p50_us / 1000, sp.p99_us / 1000,
      bp.p50_us / 1000, bp.p99_us / 1000);
  std::printf(
      "{\"bench\":\"coordinator_leases\",\"progress\":%s,\"sessions\":%d,"
      "\"ops_per_s\":%.0f,\"baseline_ops_per_s\":%.0f,\"ratio\":%.2f,"
      "\"paced_ops_per_s\":%.0f,\"baseline_paced_ops_per_s\":%.0f,\"grant_p50_"
      "ms\":%.3f,"
      "\"grant_p99_ms\":%.3f,\"baseline_grant_p50_ms\":%.3f,\"baseline_grant_"
      "p99_ms\":%.3f}\n",
      progress ? "true" : "false", sessions, s.ops_per_s, b.ops_per_s, ratio,
      sp.ops_per_s, bp.ops_per_s, sp.p50_us / 1000, sp.p99_us / 1000,
      bp.p50_us / 1000, bp.p99_us / 1000);
  if (windows) {
    const LeaseRate w = median(window_rates);
    std::printf(
        "coordinator leases with a shuffle window of %d shards: saturated "
        "%.0f grants+completions/s, %.2f of the unshuffled job's %.0f\n",
        absl::GetFlag(FLAGS_shuffle_window), w.ops_per_s,
        w.ops_per_s / s.ops_per_s, s.ops_per_s);
    std::printf(
        "{\"bench\":\"coordinator_leases_shuffle_window\",\"shuffle_window\":"
        "%d,\"ops_per_s\":%.0f,\"baseline_ops_per_s\":%.0f,\"ratio\":%.2f}\n",
        absl::GetFlag(FLAGS_shuffle_window), w.ops_per_s, s.ops_per_s,
        w.ops_per_s / s.ops_per_s);
  }
  if (mix_sources > 0) {
    const LeaseRate m = median(mix_rates);
    std::printf(
        "coordinator leases with %d sources mixed: saturated %.0f "
        "grants+completions/s, %.2f of the one-manifest job's %.0f\n",
        mix_sources, m.ops_per_s, m.ops_per_s / s.ops_per_s, s.ops_per_s);
    std::printf(
        "{\"bench\":\"coordinator_leases_mixed\",\"sources\":%d,"
        "\"ops_per_s\":%.0f,\"baseline_ops_per_s\":%.0f,\"ratio\":%.2f}\n",
        mix_sources, m.ops_per_s, s.ops_per_s, m.ops_per_s / s.ops_per_s);
  }
  echo_server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  coordinator->process.Signal(SIGTERM);
  (void)coordinator->process.Wait(absl::Seconds(20));
  return 0;
}

// ------------------------------------------------------------ plan mode

int64_t ProcStatusKb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0)
      return std::stoll(line.substr(std::strlen(field)));
  }
  return -1;
}

// Resets the peak RSS (VmHWM) to the current RSS.
void ResetPeakRss() {
  const int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, "5", 1) != 1) std::perror("clear_refs");
  close(fd);
}

// Job "big": `shards` ImageNet-like shards of 1,000-1,299 samples, 64
// ranks, shuffled.
sluice::v1::JobSpec BigJobSpec(int shards) {
  sluice::v1::JobSpec spec;
  spec.set_name("big");
  spec.set_world_size(64);
  spec.set_shuffle(true);
  spec.set_seed(7);
  for (int s = 0; s < shards; ++s) {
    auto* shard = spec.mutable_manifest()->add_shards();
    shard->set_url(
        absl::StrCat("/data/imagenet/train/shard-", 1000000 + s, ".tar"));
    shard->set_num_samples(1000 + s % 300);
    shard->set_size_bytes(100 << 20);
  }
  return spec;
}

// Compaction of a journal holding a job of --shards shards: how long the
// coordinator's lock is held for it (BeginCompaction and the snapshot's copy
// of the state) against the whole compaction (that, then serialising,
// writing and fsyncing the snapshot and renaming it over the journal), all
// of which a compaction under the lock held. Median of --rounds.
int RunCompaction() {
  const int shards = absl::GetFlag(FLAGS_shards);
  const int rounds = std::max(absl::GetFlag(FLAGS_rounds), 1);
  sluice::testing::TempDir dir;
  const sluice::v1::JobSpec spec = BigJobSpec(shards);
  {
    auto journal = sluice::OpenFileJournal(dir.File("journal"));
    if (!journal.ok()) return 1;
    auto service = sluice::CoordinatorService::Create(
        sluice::CoordinatorOptions(), *std::move(journal));
    if (!service.ok() || !(*service)->CreateJob(spec).ok()) return 1;
  }
  auto recovered = sluice::OpenFileJournal(dir.File("journal"));
  if (!recovered.ok()) return 1;
  std::vector<double> held, whole;
  int64_t bytes = 0;
  for (int r = 0; r < rounds; ++r) {
    const absl::Time start = absl::Now();
    recovered->journal->BeginCompaction();
    const sluice::JournalRecord snapshot = recovered->state.Snapshot();
    const absl::Time copied = absl::Now();
    if (!recovered->journal->FinishCompaction(snapshot).ok()) return 1;
    const absl::Time end = absl::Now();
    held.push_back(absl::ToDoubleSeconds(copied - start));
    whole.push_back(absl::ToDoubleSeconds(end - start));
    bytes = recovered->journal->bytes_written();
  }
  std::sort(held.begin(), held.end());
  std::sort(whole.begin(), whole.end());
  const double held_s = held[held.size() / 2];
  const double whole_s = whole[whole.size() / 2];
  const double ratio = held_s / whole_s;
  std::printf(
      "coordinator compaction: %d shards, snapshot %lld bytes; lock held "
      "%.3f s   baseline (the whole compaction, as held under the lock): "
      "%.3f s   ratio %.3f\n",
      shards, static_cast<long long>(bytes), held_s, whole_s, ratio);
  std::printf(
      "{\"bench\":\"coordinator_compaction\",\"shards\":%d,"
      "\"snapshot_bytes\":%lld,\"lock_held_s\":%.4f,"
      "\"baseline_whole_compaction_s\":%.4f,\"ratio\":%.3f}\n",
      shards, static_cast<long long>(bytes), held_s, whole_s, ratio);
  return 0;
}

int RunPlan() {
  const int shards = absl::GetFlag(FLAGS_shards);
  sluice::testing::TempDir dir;
  const sluice::v1::JobSpec spec = BigJobSpec(shards);
  // Baseline: what arrives over the wire, parsed once.
  const std::string wire = spec.SerializeAsString();
  const absl::Time parse_start = absl::Now();
  {
    sluice::v1::JobSpec parsed;
    if (!parsed.ParseFromString(wire)) return 1;
  }
  const double parse_s = absl::ToDoubleSeconds(absl::Now() - parse_start);

  auto journal = sluice::OpenFileJournal(dir.File("journal"));
  if (!journal.ok()) return 1;
  auto service = sluice::CoordinatorService::Create(
      sluice::CoordinatorOptions(), *std::move(journal));
  if (!service.ok()) return 1;
  const int64_t rss_before_kb = ProcStatusKb("VmRSS:");
  ResetPeakRss();
  const absl::Time start = absl::Now();
  auto job = (*service)->CreateJob(spec);
  const double create_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (!job.ok()) {
    std::fprintf(stderr, "CreateJob: %s\n", job.status().ToString().c_str());
    return 1;
  }
  const int64_t peak_kb = ProcStatusKb("VmHWM:");
  const int64_t rss_after_kb = ProcStatusKb("VmRSS:");
  const double peak_per_shard = (peak_kb - rss_before_kb) * 1024.0 / shards;
  const double kept_per_shard =
      (rss_after_kb - rss_before_kb) * 1024.0 / shards;
  const double ratio = create_s / parse_s;
  std::printf(
      "coordinator plan: %d shards (%lld samples) created in %.3f s; memory "
      "per shard: "
      "peak %.0f B, retained %.0f B   baseline (parse the manifest): %.3f s   "
      "ratio "
      "%.2f\n",
      shards, static_cast<long long>(job->status().total_samples()), create_s,
      peak_per_shard, kept_per_shard, parse_s, ratio);
  std::printf(
      "{\"bench\":\"coordinator_plan\",\"shards\":%d,\"create_s\":%.3f,"
      "\"peak_bytes_per_shard\":%.0f,\"retained_bytes_per_shard\":%.0f,"
      "\"baseline_parse_s\":%.3f,\"ratio\":%.2f}\n",
      shards, create_s, peak_per_shard, kept_per_shard, parse_s, ratio);
  const int mix_sources = absl::GetFlag(FLAGS_sources);
  if (mix_sources > 0) {
    // The same shards as a mixed job, on a second service (its own journal).
    const sluice::v1::JobSpec mixed = MixedSpec(spec, "big-mix", mix_sources);
    {
      // As before the one-manifest job: the request parsed once and freed,
      // so both measurements start from the same heap.
      sluice::v1::JobSpec parsed;
      if (!parsed.ParseFromString(mixed.SerializeAsString())) return 1;
    }
    auto mix_journal = sluice::OpenFileJournal(dir.File("journal-mix"));
    if (!mix_journal.ok()) return 1;
    auto mix_service = sluice::CoordinatorService::Create(
        sluice::CoordinatorOptions(), *std::move(mix_journal));
    if (!mix_service.ok()) return 1;
    const int64_t mix_rss_before_kb = ProcStatusKb("VmRSS:");
    ResetPeakRss();
    const absl::Time mix_start = absl::Now();
    auto mix_job = (*mix_service)->CreateJob(mixed);
    const double mix_s = absl::ToDoubleSeconds(absl::Now() - mix_start);
    if (!mix_job.ok()) {
      std::fprintf(stderr, "CreateJob (mixed): %s\n",
                   mix_job.status().ToString().c_str());
      return 1;
    }
    const double mix_peak =
        (ProcStatusKb("VmHWM:") - mix_rss_before_kb) * 1024.0 / shards;
    const double mix_kept =
        (ProcStatusKb("VmRSS:") - mix_rss_before_kb) * 1024.0 / shards;
    std::printf(
        "coordinator plan, %d sources mixed: %d shards created in %.3f s; "
        "memory per shard: peak %.0f B, retained %.0f B   one manifest: "
        "%.3f s, %.0f B   ratio %.2f\n",
        mix_sources, shards, mix_s, mix_peak, mix_kept, create_s,
        kept_per_shard, mix_s / create_s);
    std::printf(
        "{\"bench\":\"coordinator_plan_mixed\",\"sources\":%d,\"shards\":"
        "%d,\"create_s\":%.3f,\"peak_bytes_per_shard\":%.0f,"
        "\"retained_bytes_per_shard\":%.0f,\"baseline_create_s\":%.3f,"
        "\"ratio\":%.2f}\n",
        mix_sources, shards, mix_s, mix_peak, mix_kept, create_s,
        mix_s / create_s);
  }
  return 0;
}

// ------------------------------------------------------------ etcd mode

// The benchmark's endless job of 1-sample units on the coordinator at
// `address`.
absl::Status CreateBenchJob(const std::string& address) {
  sluice::v1::JobSpec spec;
  spec.set_name("bench");
  for (int s = 0; s < 1000; ++s) {
    auto* shard = spec.mutable_manifest()->add_shards();
    shard->set_url(absl::StrCat("/data/bench/shard-", s, ".tar"));
    shard->set_num_samples(1000);
  }
  spec.set_max_samples_per_lease(1);
  spec.set_world_size(0);
  spec.set_num_epochs(0);
  return sluice::testing::CreateJob(address, spec);
}

// Whether a coordinator log in `dir` other than `except` holds `text`.
bool AnotherLogHolds(const std::string& dir, const std::string& except,
                     const std::string& text) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string path = entry.path().string();
    if (path == except || entry.path().extension() != ".log" ||
        path.find("sluice-coordinator") == std::string::npos) {
      continue;
    }
    std::optional<std::string> log = sluice::testing::ReadWholeFile(path);
    if (log && log->find(text) != std::string::npos) return true;
  }
  return false;
}

int RunEtcd() {
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const double paced = absl::GetFlag(FLAGS_etcd_paced_ops_per_s);
  const absl::Duration ttl = absl::GetFlag(FLAGS_election_ttl);
  sluice::testing::TempDir dir;
  auto etcd = sluice::testing::Etcd::Start(dir.path());
  if (!etcd.ok()) {
    std::fprintf(stderr, "etcd: %s\n", etcd.status().ToString().c_str());
    return 1;
  }
  auto local =
      sluice::testing::StartServer("sluice-coordinator", dir.path(),
                                   {"--wait_for_data_servers=false",
                                    "--journal_dir=" + dir.File("journal")});
  const std::vector<std::string> etcd_args = {
      "--wait_for_data_servers=false",
      absl::StrCat("--journal=etcd://", (*etcd)->endpoint(), "/bench"),
      absl::StrCat("--election_ttl=", absl::FormatDuration(ttl))};
  auto leader =
      sluice::testing::StartServer("sluice-coordinator", dir.path(), etcd_args);
  if (!local.ok() || !leader.ok()) {
    std::fprintf(stderr, "coordinators: %s %s\n",
                 local.status().ToString().c_str(),
                 leader.status().ToString().c_str());
    return 1;
  }
  if (absl::Status ready = sluice::testing::WaitForReadiness(
          leader->grpc_address, true, absl::Seconds(30));
      !ready.ok()) {
    std::fprintf(stderr, "leader: %s\n", ready.ToString().c_str());
    return 1;
  }
  for (const auto* c : {&*local, &*leader}) {
    absl::Status created = CreateBenchJob(c->grpc_address);
    if (!created.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", created.ToString().c_str());
      return 1;
    }
  }
  std::vector<LeaseRate> etcd_rates, local_rates, etcd_paced, local_paced;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    local_rates.push_back(
        Drive(local->grpc_address, "bench", sessions, seconds, 0));
    etcd_rates.push_back(
        Drive(leader->grpc_address, "bench", sessions, seconds, 0));
    local_paced.push_back(
        Drive(local->grpc_address, "bench", sessions, seconds, paced));
    etcd_paced.push_back(
        Drive(leader->grpc_address, "bench", sessions, seconds, paced));
    std::fprintf(stderr,
                 "round %d: saturated etcd journal %.0f ops/s, local journal "
                 "%.0f; paced %.0f ops/s: grant p99 etcd %.2f ms, local %.2f "
                 "ms\n",
                 r, etcd_rates.back().ops_per_s, local_rates.back().ops_per_s,
                 paced, etcd_paced.back().p99_us / 1000,
                 local_paced.back().p99_us / 1000);
  }
  auto median = [](std::vector<LeaseRate> v, bool by_p99) {
    std::sort(v.begin(), v.end(), [&](const LeaseRate& a, const LeaseRate& b) {
      return by_p99 ? a.p99_us < b.p99_us : a.ops_per_s < b.ops_per_s;
    });
    return v[v.size() / 2];
  };
  const LeaseRate e = median(etcd_rates, false), l = median(local_rates, false);
  const LeaseRate ep = median(etcd_paced, true), lp = median(local_paced, true);

  // Failover: a standby on the same prefix, the leader SIGKILLed; a
  // trainer asks the standby for a lease until it grants one.
  absl::StatusOr<sluice::testing::ServerProcess> standby =
      sluice::testing::StartServer("sluice-coordinator", dir.path(), etcd_args);
  if (!standby.ok()) {
    std::fprintf(stderr, "standby: %s\n", standby.status().ToString().c_str());
    return 1;
  }
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  while (!AnotherLogHolds(dir.path(), leader->log_path, "standby;") &&
         absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(10));  // polls the standby's log
  }
  const absl::Time killed = absl::Now();
  leader->process.Kill();
  absl::StatusOr<sluice::v1::Lease> grant;
  do {
    grant = sluice::testing::FirstGrant(standby->grpc_address, "bench",
                                        "failover-trainer");
    if (!grant.ok()) absl::SleepFor(absl::Milliseconds(10));  // a retry
  } while (!grant.ok() && absl::Now() - killed < absl::Seconds(60));
  const double failover_s = absl::ToDoubleSeconds(absl::Now() - killed);
  if (!grant.ok()) {
    std::fprintf(stderr, "grant after failover: %s\n",
                 grant.status().ToString().c_str());
    return 1;
  }
  const double ratio = e.ops_per_s / l.ops_per_s;
  std::printf(
      "coordinator journal in etcd (%d sessions): saturated %.0f "
      "grants+completions/s (local journal %.0f, ratio %.2f); paced at %.0f "
      "ops/s: grant latency p50 %.2f ms p99 %.2f ms (local p50 %.2f ms p99 "
      "%.2f ms); failover (leader SIGKILL -> first Grant from the standby, "
      "election TTL %s) %.2f s\n",
      sessions, e.ops_per_s, l.ops_per_s, ratio, paced, ep.p50_us / 1000,
      ep.p99_us / 1000, lp.p50_us / 1000, lp.p99_us / 1000,
      absl::FormatDuration(ttl).c_str(), failover_s);
  std::printf(
      "{\"bench\":\"coordinator_etcd\",\"sessions\":%d,\"ops_per_s\":%.0f,"
      "\"baseline_ops_per_s\":%.0f,\"ratio\":%.2f,\"paced_ops_per_s\":%.0f,"
      "\"grant_p50_ms\":%.3f,\"grant_p99_ms\":%.3f,"
      "\"baseline_grant_p50_ms\":%.3f,\"baseline_grant_p99_ms\":%.3f,"
      "\"election_ttl_s\":%.1f,\"failover_s\":%.2f}\n",
      sessions, e.ops_per_s, l.ops_per_s, ratio, paced, ep.p50_us / 1000,
      ep.p99_us / 1000, lp.p50_us / 1000, lp.p99_us / 1000,
      absl::ToDoubleSeconds(ttl), failover_s);
  for (auto* c : {&*local, &*standby}) {
    c->process.Signal(SIGTERM);
    (void)c->process.Wait(absl::Seconds(20));
  }
  return 0;
}

// ---------------------------------------------------- remote_grants mode

int RunRemoteGrants() {
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  const std::string baseline = absl::GetFlag(FLAGS_baseline);
  if (coordinator.empty() || baseline.empty()) {
    std::fprintf(stderr,
                 "remote_grants: --coordinator and --baseline are required\n");
    return 2;
  }
  if (absl::Status created = CreateBenchJob(coordinator); !created.ok()) {
    std::fprintf(stderr, "CreateJob: %s\n", created.ToString().c_str());
    return 1;
  }
  const int sessions = absl::GetFlag(FLAGS_sessions);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  const double paced = absl::GetFlag(FLAGS_paced_ops_per_s);
  std::vector<LeaseRate> sluice_paced, bare_paced;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    bare_paced.push_back(Drive(baseline, "bench", sessions, seconds, paced));
    sluice_paced.push_back(
        Drive(coordinator, "bench", sessions, seconds, paced));
    std::fprintf(stderr,
                 "round %d: paced %.0f ops/s: grant p50/p99 sluice %.2f/%.2f "
                 "ms, bare gRPC %.2f/%.2f ms\n",
                 r, paced, sluice_paced.back().p50_us / 1000,
                 sluice_paced.back().p99_us / 1000,
                 bare_paced.back().p50_us / 1000,
                 bare_paced.back().p99_us / 1000);
  }
  auto median = [](std::vector<LeaseRate> v, bool by_p99) {
    std::sort(v.begin(), v.end(), [&](const LeaseRate& a, const LeaseRate& b) {
      return by_p99 ? a.p99_us < b.p99_us : a.p50_us < b.p50_us;
    });
    return v[v.size() / 2];
  };
  const double p50 = median(sluice_paced, false).p50_us / 1000;
  const double p99 = median(sluice_paced, true).p99_us / 1000;
  const double bare_p50 = median(bare_paced, false).p50_us / 1000;
  const double bare_p99 = median(bare_paced, true).p99_us / 1000;
  std::printf(
      "grant latency across hosts (%d sessions, paced %.0f ops/s): p50 %.2f "
      "ms p99 %.2f ms; bare gRPC on the same hosts p50 %.2f ms p99 %.2f ms; "
      "ratio p50 %.2f p99 %.2f\n",
      sessions, paced, p50, p99, bare_p50, bare_p99, p50 / bare_p50,
      p99 / bare_p99);
  std::printf(
      "{\"bench\":\"coordinator_remote_grants\",\"sessions\":%d,"
      "\"paced_ops_per_s\":%.0f,\"grant_p50_ms\":%.3f,\"grant_p99_ms\":%.3f,"
      "\"baseline_grant_p50_ms\":%.3f,\"baseline_grant_p99_ms\":%.3f,"
      "\"ratio_p50\":%.2f,\"ratio_p99\":%.2f}\n",
      sessions, paced, p50, p99, bare_p50, bare_p99, p50 / bare_p50,
      p99 / bare_p99);
  return 0;
}

}  // namespace

// ------------------------------------------------------------ open mode

// One reader of a big job: Hello, Want{2}, then heartbeats (Beat) until
// stopped; notes when its EpochBegin arrives.
class OpenSession : public QueuedSession {
 public:
  OpenSession(sluice::v1::Coordinator::Stub* stub, const std::string& job,
              int rank, int worker, int workers, std::atomic<int>* begun,
              std::atomic<int64_t>* interval_ms)
      : begun_(begun), interval_ms_(interval_ms) {
    TrainerMessage hello;
    hello.mutable_hello()->set_job(job);
    hello.mutable_hello()->set_rank(rank);
    hello.mutable_hello()->set_worker(worker);
    hello.mutable_hello()->set_num_workers(workers);
    hello.mutable_hello()->set_trainer_id(
        absl::StrCat("open-", rank, "-", worker));
    TrainerMessage want;
    want.mutable_want()->set_credits(2);
    Begin(stub, {hello, want});
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (in_.has_welcome() && in_.welcome().heartbeat_interval_ms() > 0) {
      interval_ms_->store(in_.welcome().heartbeat_interval_ms());
    }
    if (in_.has_epoch_begin() && !begun_seen_) {
      begun_seen_ = true;
      begun_->fetch_add(1);
    }
    if (in_.has_grant()) {
      absl::MutexLock lock(&mu_);
      held_.push_back(in_.grant().lease());
      if (completed_at_ != absl::InfinitePast()) {
        latencies_us_.push_back(
            absl::ToDoubleMicroseconds(absl::Now() - completed_at_));
        completed_at_ = absl::InfinitePast();
      }
    }
    StartRead(&in_);
  }
  void Beat() {
    TrainerMessage beat;
    beat.mutable_heartbeat();
    Enqueue({beat});
  }
  // Reads the oldest lease held to its end (Progress + Complete); the
  // coordinator then grants the next. False when none is held.
  bool CompleteOne() {
    sluice::v1::Lease lease;
    {
      absl::MutexLock lock(&mu_);
      if (held_.empty()) return false;
      lease = std::move(held_.front());
      held_.pop_front();
      completed_at_ = absl::Now();
    }
    TrainerMessage progress;
    progress.mutable_progress()->mutable_lease()->set_lease_id(
        lease.lease_id());
    progress.mutable_progress()->mutable_lease()->set_fence(lease.fence());
    progress.mutable_progress()->set_consumed(lease.unit().end() -
                                              lease.unit().begin());
    TrainerMessage complete;
    complete.mutable_complete()->mutable_lease()->set_lease_id(
        lease.lease_id());
    complete.mutable_complete()->mutable_lease()->set_fence(lease.fence());
    Enqueue({progress, complete});
    return true;
  }
  // Complete -> next Grant, in microseconds, for each grant so far.
  std::vector<double> TakeLatencies() {
    absl::MutexLock lock(&mu_);
    return std::move(latencies_us_);
  }

 private:
  std::atomic<int>* begun_;
  std::atomic<int64_t>* interval_ms_;
  bool begun_seen_ = false;  // reads are serialized
  absl::Mutex mu_;
  std::deque<sluice::v1::Lease> held_ ABSL_GUARDED_BY(mu_);
  absl::Time completed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<double> latencies_us_ ABSL_GUARDED_BY(mu_);
};

// Bare gRPC: each Hello answered with Welcome and EpochBegin, each Want
// credit and each Complete with a Grant of a 100-sample unit (no state, no
// journal): the gRPC work of the coordinator's paced phase without the
// coordinator.
class OpenEchoSession
    : public grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage> {
 public:
  OpenEchoSession() {
    const int64_t interval = absl::GetFlag(FLAGS_heartbeat_interval_ms);
    welcome_.mutable_welcome()->set_heartbeat_interval_ms(interval);
    welcome_.mutable_welcome()->set_lease_ttl_ms(interval * 10);
    begin_.mutable_epoch_begin()->set_samples_for_rank(1000);
    sluice::v1::Lease* lease = grant_.mutable_grant()->mutable_lease();
    lease->set_lease_id("big/e0/f123456");
    lease->set_fence(123456);
    lease->set_job("big");
    lease->mutable_unit()->mutable_shard()->set_url("/data/big/shard-517.tar");
    lease->mutable_unit()->mutable_shard()->set_shard_index(517);
    lease->mutable_unit()->set_begin(0);
    lease->mutable_unit()->set_end(100);
    lease->set_expires_at_unix_ms(absl::ToUnixMillis(absl::Now()));
    StartRead(&in_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      if (!writing_) Finish(grpc::Status::OK);
      return;
    }
    if (in_.has_hello()) {
      Send(&welcome_);
      Send(&begin_);
    } else if (in_.has_want()) {
      for (int i = 0; i < in_.want().credits(); ++i) Send(&grant_);
    } else if (in_.has_complete()) {
      Send(&grant_);
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (ok && !queue_.empty()) {
      StartWrite(queue_.front());
      queue_.pop_front();
    } else {
      writing_ = false;
      queue_.clear();
      if (closing_) Finish(grpc::Status::OK);
    }
  }
  void OnDone() override { delete this; }

 private:
  void Send(const CoordinatorMessage* m) {
    absl::MutexLock lock(&mu_);
    if (writing_) {
      queue_.push_back(m);
    } else {
      writing_ = true;
      StartWrite(m);
    }
  }

  TrainerMessage in_;
  CoordinatorMessage welcome_, begin_, grant_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // the trainer's side closed
  std::deque<const CoordinatorMessage*> queue_ ABSL_GUARDED_BY(mu_);
};

class OpenEchoService : public sluice::v1::Coordinator::CallbackService {
 public:
  grpc::ServerBidiReactor<TrainerMessage, CoordinatorMessage>* Session(
      grpc::CallbackServerContext*) override {
    return new OpenEchoSession();
  }
};

// Seconds of CPU (user + system) `pid` has used.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces): utime is the
  // 14th field, stime the 15th.
  const size_t close = stat.rfind(')');
  std::vector<std::string> fields;
  std::string field;
  for (size_t i = close + 2; i <= stat.size(); ++i) {
    if (i == stat.size() || stat[i] == ' ') {
      fields.push_back(field);
      field.clear();
    } else {
      field += stat[i];
    }
  }
  double utime = 0, stime = 0;
  if (fields.size() > 12) {
    (void)absl::SimpleAtod(fields[11], &utime);
    (void)absl::SimpleAtod(fields[12], &stime);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int64_t RssKb(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      (void)absl::SimpleAtoi(
          absl::StripAsciiWhitespace(absl::StripSuffix(line.substr(6), "kB")),
          &kb);
      return kb;
    }
  }
  return 0;
}

// A data server's registration stream beside the sessions: it registers,
// then heartbeats at the interval the coordinator asks for and times each
// heartbeat's acknowledgement. A heartbeat the coordinator handles later
// than its timeout after the previous one means it took the server for
// dead meanwhile.
class DataServerProbe {
 public:
  explicit DataServerProbe(const std::string& address)
      : stub_(Stubs(address, 1)), thread_([this] { Run(); }) {}
  ~DataServerProbe() { Stop(); }
  void Stop() {
    stopping_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool registered() const { return registered_.load(); }
  absl::Duration longest_ack() {
    absl::MutexLock lock(&mu_);
    return longest_ack_;
  }
  // The longest time between two heartbeats' acknowledgements.
  absl::Duration longest_gap() {
    absl::MutexLock lock(&mu_);
    return longest_gap_;
  }
  absl::Duration timeout() const {
    return absl::Milliseconds(timeout_ms_.load());
  }
  int64_t acks() {
    absl::MutexLock lock(&mu_);
    return acks_;
  }

 private:
  void Run() {
    grpc::ClientContext context;
    auto stream = stub_[0]->RegisterDataServer(&context);
    sluice::v1::DataServerMessage hello;
    hello.mutable_register_()->set_address("127.0.0.1:9");
    hello.mutable_register_()->set_capacity(1);
    sluice::v1::CoordinatorToDataServer reply;
    if (!stream->Write(hello) || !stream->Read(&reply) ||
        !reply.has_registered()) {
      std::fprintf(stderr, "data server probe: registration failed\n");
      return;
    }
    const absl::Duration interval =
        absl::Milliseconds(reply.registered().heartbeat_interval_ms());
    timeout_ms_ = reply.registered().heartbeat_timeout_ms();
    registered_ = true;
    absl::Time last_ack = absl::Now();
    while (!stopping_.load()) {
      absl::SleepFor(interval);
      sluice::v1::DataServerMessage beat;
      beat.mutable_heartbeat();
      const absl::Time sent = absl::Now();
      if (!stream->Write(beat)) break;
      bool acked = false;
      while (!acked && stream->Read(&reply)) acked = reply.has_heartbeat_ack();
      if (!acked) break;
      const absl::Time now = absl::Now();
      absl::MutexLock lock(&mu_);
      longest_ack_ = std::max(longest_ack_, now - sent);
      longest_gap_ = std::max(longest_gap_, now - last_ack);
      ++acks_;
      last_ack = now;
    }
    context.TryCancel();
  }

  std::vector<std::unique_ptr<sluice::v1::Coordinator::Stub>> stub_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> timeout_ms_{0};
  absl::Mutex mu_;
  absl::Duration longest_ack_ ABSL_GUARDED_BY(mu_);
  absl::Duration longest_gap_ ABSL_GUARDED_BY(mu_);
  int64_t acks_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

struct OpenResult {
  double open_s = 0;
  int opened = 0;
  double open_cpu_s = 0;
  double idle_cpu_per_session_s = 0;
  double rss_kb_per_session = 0;
  int64_t expired = 0;
  double heartbeats_per_s = 0;
  int64_t heartbeat_interval_ms = 0;
  // The paced phase: grants per second reached, coordinator CPU per grant
  // (beyond the idle phase's rate), grant latency.
  double paced_grants_per_s = 0;
  double cpu_us_per_grant = 0;
  double idle_cores_after = 0;  // the idle rate again, after the paced phase
  // Of it, under the state lock, from the per-message counters.
  double locked_cpu_us_per_grant = 0;
  double grant_p50_ms = 0;
  double grant_p99_ms = 0;
};

// CPU seconds the coordinator spent under its state lock handling session
// messages other than heartbeats
// (sluice_coordinator_message_lock_cpu_seconds_total): in the paced phase,
// the Progress and Complete messages and the grants they make room for.
double MessageLockCpuSeconds(const std::string& metrics_address) {
  if (metrics_address.empty()) return 0;
  auto page =
      sluice::testing::HttpGet("http://" + metrics_address + "/metrics");
  if (!page.ok()) return 0;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
    if (!absl::ConsumePrefix(
            &line, "sluice_coordinator_message_lock_cpu_seconds_total{") ||
        absl::StartsWith(line, "message=\"heartbeat\"")) {
      continue;
    }
    const size_t space = line.rfind(' ');
    double seconds = 0;
    if (space != absl::string_view::npos &&
        absl::SimpleAtod(line.substr(space + 1), &seconds)) {
      total += seconds;
    }
  }
  return total;
}

// Opens `ranks` x `workers` sessions of `job` at `address`; with `pid`, the
// server's CPU and memory are measured while opening and idle, and with
// `paced` also per grant.
OpenResult OpenAll(const std::string& address, const std::string& job,
                   int ranks, int workers, pid_t pid, bool paced_grants,
                   const std::string& metrics_address = "") {
  auto stubs = Stubs(address, 8);  // several trainer processes' connections
  OpenResult r;
  const int total = ranks * workers;
  const double cpu0 = pid > 0 ? CpuSeconds(pid) : 0;
  const int64_t rss0 = pid > 0 ? RssKb(pid) : 0;
  std::atomic<int> begun{0};
  std::atomic<int64_t> interval_ms{1000};  // as the Welcomes say
  std::vector<std::unique_ptr<OpenSession>> all;
  all.reserve(static_cast<size_t>(total));
  const absl::Time start = absl::Now();
  for (int i = 0; i < total; ++i) {
    all.push_back(std::make_unique<OpenSession>(
        stubs[static_cast<size_t>(i) % stubs.size()].get(), job, i / workers,
        i % workers, workers, &begun, &interval_ms));
  }
  // Each session heartbeats at the interval its Welcome asks for, the
  // sessions spread evenly over it (every 10 ms, the share due).
  std::atomic<bool> beating{true};
  std::atomic<int64_t> beats_sent{0};
  std::thread beats([&] {
    size_t next = 0;
    double owed = 0;
    while (beating.load()) {
      owed += static_cast<double>(all.size()) * 10.0 /
              static_cast<double>(std::max<int64_t>(1, interval_ms.load()));
      for (; owed >= 1; owed -= 1, ++next) {
        all[next % all.size()]->Beat();
        beats_sent.fetch_add(1);
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  });
  const absl::Time deadline = start + absl::Seconds(180);
  while (begun.load() < total && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(5));
  r.open_s = absl::ToDoubleSeconds(absl::Now() - start);
  r.opened = begun.load();
  if (pid > 0) {
    const double cpu1 = CpuSeconds(pid);
    r.open_cpu_s = cpu1 - cpu0;
    const double idle = absl::GetFlag(FLAGS_idle_seconds);
    const int64_t beats0 = beats_sent.load();
    absl::SleepFor(absl::Seconds(idle));
    r.idle_cpu_per_session_s = (CpuSeconds(pid) - cpu1) / idle / total;
    r.heartbeats_per_s = static_cast<double>(beats_sent.load() - beats0) / idle;
    r.heartbeat_interval_ms = interval_ms.load();
    r.rss_kb_per_session =
        static_cast<double>(RssKb(pid) - rss0) / static_cast<double>(total);
  }
  if (pid > 0 && paced_grants) {
    // Paced grants: every 10 ms the share due, from the sessions in turn.
    const double rate = absl::GetFlag(FLAGS_open_paced_grants_per_s);
    const double paced = absl::GetFlag(FLAGS_paced_seconds);
    for (auto& session : all) session->TakeLatencies();
    const double cpu2 = CpuSeconds(pid);
    const double messages2 = MessageLockCpuSeconds(metrics_address);
    const absl::Time paced_start = absl::Now();
    size_t next = 0;
    double owed = 0;
    while (absl::Now() - paced_start < absl::Seconds(paced)) {
      owed += rate / 100;
      for (size_t tried = 0; owed >= 1 && tried < all.size(); ++tried) {
        if (all[next++ % all.size()]->CompleteOne()) owed -= 1;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    absl::SleepFor(absl::Milliseconds(500));  // the last grants arrive
    const double paced_elapsed =
        absl::ToDoubleSeconds(absl::Now() - paced_start);
    std::vector<double> latencies;
    for (auto& session : all) {
      std::vector<double> l = session->TakeLatencies();
      latencies.insert(latencies.end(), l.begin(), l.end());
    }
    r.paced_grants_per_s = static_cast<double>(latencies.size()) / paced;
    const double cpu3 = CpuSeconds(pid);
    const double messages3 = MessageLockCpuSeconds(metrics_address);
    // The heartbeats' own cost again, after: the paced phase's CPU less
    // the mean of the idle rates before and after it is the grants'. At
    // thousands of sessions the heartbeats cost as much as the grants, and
    // one idle window alone moves the difference by tens of percent. The
    // CPU spent under the state lock (the coordinator's own work, without
    // gRPC's) is counted directly, from the coordinator's per-message
    // counters without the heartbeats'.
    const double idle = absl::GetFlag(FLAGS_idle_seconds);
    absl::SleepFor(absl::Seconds(idle));
    const double idle_after = (CpuSeconds(pid) - cpu3) / idle;
    r.idle_cores_after = idle_after;
    if (!latencies.empty()) {
      const double idle_rate =
          (r.idle_cpu_per_session_s * total + idle_after) / 2;
      r.cpu_us_per_grant = (cpu3 - cpu2 - idle_rate * paced_elapsed) /
                           static_cast<double>(latencies.size()) * 1e6;
      r.locked_cpu_us_per_grant =
          (messages3 - messages2) / static_cast<double>(latencies.size()) * 1e6;
      std::sort(latencies.begin(), latencies.end());
      r.grant_p50_ms = latencies[latencies.size() / 2] / 1000;
      r.grant_p99_ms = latencies[std::min(latencies.size() - 1,
                                          latencies.size() * 99 / 100)] /
                       1000;
    }
    auto status = sluice::testing::GetJob(address, job);
    if (status.ok()) r.expired = status->status().leases().expired();
  }
  beating = false;
  beats.join();
  for (auto& s : all) s->Stop();
  for (auto& s : all) {
    while (!s->done()) absl::SleepFor(absl::Milliseconds(1));
  }
  return r;
}

// The coordinator's lock holds between two scrapes of its /metrics
// (sluice_coordinator_lock_hold_seconds, wall time, or
// sluice_coordinator_lock_hold_cpu_seconds, the holding thread's CPU time):
// how many, how many over 1 ms, and the smallest bucket bound every one of
// them fits under.
using HoldBuckets = std::vector<std::pair<double, uint64_t>>;  // cumulative

HoldBuckets ScrapeLockHolds(const std::string& metrics_address,
                            const std::string& histogram) {
  HoldBuckets buckets;
  auto page =
      sluice::testing::HttpGet("http://" + metrics_address + "/metrics");
  if (!page.ok()) return buckets;
  const std::string prefix = histogram + "_bucket{le=\"";
  for (absl::string_view line : absl::StrSplit(page->body, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    const size_t quote = line.find('"');
    const size_t space = line.rfind(' ');
    if (quote == absl::string_view::npos || space == absl::string_view::npos)
      continue;
    double bound = 0, n = 0;
    const absl::string_view le = line.substr(0, quote);
    if (le == "+Inf") {
      bound = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(le, &bound)) {
      continue;
    }
    if (!absl::SimpleAtod(line.substr(space + 1), &n)) continue;
    buckets.emplace_back(bound, static_cast<uint64_t>(n));
  }
  return buckets;
}

struct LockHolds {
  uint64_t count = 0;
  uint64_t over_1ms = 0;
  double longest_under_s = 0;
};

LockHolds HoldsBetween(const HoldBuckets& before, const HoldBuckets& after) {
  LockHolds holds;
  if (after.empty() || before.size() != after.size()) return holds;
  holds.count = after.back().second - before.back().second;
  for (size_t i = 0; i < after.size(); ++i) {
    const uint64_t cumulative = after[i].second - before[i].second;
    if (after[i].first == 0.001) holds.over_1ms = holds.count - cumulative;
    if (holds.longest_under_s == 0 && cumulative == holds.count)
      holds.longest_under_s = after[i].first;
  }
  return holds;
}

// Writes grpc=ADDRESS to --port_file (atomically).
bool WritePortFile(const std::string& address) {
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  const std::string tmp = port_file + ".tmp";
  {
    std::ofstream out(tmp);
    out << "grpc=" << address << "\n";
  }
  if (port_file.empty() || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
    std::fprintf(stderr, "cannot write --port_file %s\n", port_file.c_str());
    return false;
  }
  return true;
}

// Serves `service` on --listen until killed, its address in --port_file.
int ServeUntilKilled(grpc::Service* service) {
  std::string address;
  std::unique_ptr<grpc::Server> server =
      Serve(service, &address, absl::GetFlag(FLAGS_listen));
  if (server == nullptr) {
    std::fprintf(stderr, "cannot listen on %s\n",
                 absl::GetFlag(FLAGS_listen).c_str());
    return 1;
  }
  if (!WritePortFile(address)) return 1;
  server->Wait();  // until killed
  return 0;
}

// The open mode's baseline server, in a process of its own so that its CPU
// and memory are measured apart from the load generator's.
int RunEchoServer() {
  const int n = std::max(1, absl::GetFlag(FLAGS_echo_servers));
  if (n == 1) {
    OpenEchoService echo;
    return ServeUntilKilled(&echo);
  }
  // The first server picks the port; the others share it.
  std::vector<std::unique_ptr<OpenEchoService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  std::string address;
  for (int i = 0; i < n; ++i) {
    services.push_back(std::make_unique<OpenEchoService>());
    std::string listening;
    servers.push_back(Serve(services.back().get(), &listening,
                            i == 0 ? absl::GetFlag(FLAGS_listen) : address));
    if (servers.back() == nullptr) {
      std::fprintf(
          stderr, "cannot listen on %s\n",
          i == 0 ? absl::GetFlag(FLAGS_listen).c_str() : address.c_str());
      return 1;
    }
    if (i == 0) address = listening;
  }
  if (!WritePortFile(address)) return 1;
  servers[0]->Wait();  // until killed
  return 0;
}

// The leases mode's baseline server (a canned Grant for every Want credit
// and Complete), for remote_grants on another host.
int RunGrantEchoServer() {
  EchoService echo(CannedGrant());
  return ServeUntilKilled(&echo);
}

// Starts this binary as the echo server, with the coordinator's malloc
// (jemalloc, preloaded) so that memory per session compares like for like.
absl::StatusOr<sluice::testing::ChildProcess> StartEchoServer(
    const sluice::testing::TempDir& dir, int64_t heartbeat_interval_ms,
    std::string* address) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return absl::InternalError("cannot read /proc/self/exe");
  self[n] = '\0';
  const std::string port_file = dir.File("echo.ports");
  setenv("LD_PRELOAD", "libjemalloc.so.2", 1);
  auto child = sluice::testing::ChildProcess::Start(
      {self, "--mode=echo_server", "--port_file=" + port_file,
       absl::StrCat("--heartbeat_interval_ms=", heartbeat_interval_ms),
       absl::StrCat("--echo_servers=", absl::GetFlag(FLAGS_echo_servers))},
      dir.File("echo.log"));
  unsetenv("LD_PRELOAD");
  if (!child.ok()) return child.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline && child->running()) {
    if (auto text = sluice::testing::ReadWholeFile(port_file)) {
      *address = sluice::testing::ParseKeyValueFile(*text)["grpc"];
      if (!address->empty()) return child;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::UnavailableError("the echo server did not start (echo.log)");
}

int RunOpen() {
  const int workers = absl::GetFlag(FLAGS_workers);
  std::string json =
      "{\"bench\":\"coordinator_open\",\"workers\":" + std::to_string(workers) +
      ",\"sizes\":[";
  double worst_ratio = 0, first_cpu_per_grant = 0, worst_grant_cpu_ratio = 0;
  double first_locked_per_grant = 0, worst_locked_ratio = 0;
  double first_bare_per_grant = 0, worst_bare_ratio = 0;
  bool first = true;
  for (const std::string& size : absl::GetFlag(FLAGS_open_sessions)) {
    int sessions = 0;
    if (!absl::SimpleAtoi(size, &sessions) || sessions < workers) {
      std::fprintf(stderr, "--open_sessions: %s is not a count >= --workers\n",
                   size.c_str());
      return 2;
    }
    const int ranks = sessions / workers;
    sluice::testing::TempDir dir;
    auto coordinator = StartCoordinator(dir);
    if (!coordinator.ok()) return 1;
    // Units of 100 samples: every reader's two grants and the paced
    // phase's, with room to spare.
    const int paced_grants =
        static_cast<int>(absl::GetFlag(FLAGS_open_paced_grants_per_s) *
                         absl::GetFlag(FLAGS_paced_seconds));
    sluice::v1::JobSpec spec;
    spec.set_name("big");
    for (int s = 0; s < 2 * ranks * workers + 2 * paced_grants + 4096; ++s) {
      auto* shard = spec.mutable_manifest()->add_shards();
      shard->set_url(absl::StrCat("/data/big/shard-", s, ".tar"));
      shard->set_num_samples(100);
    }
    spec.set_world_size(ranks);
    spec.set_num_epochs(1);
    spec.set_mode(sluice::v1::MODE_DYNAMIC);
    spec.set_max_samples_per_lease(100);
    spec.set_shuffle(false);
    if (absl::Status created =
            sluice::testing::CreateJob(coordinator->grpc_address, spec);
        !created.ok()) {
      std::fprintf(stderr, "CreateJob: %s\n", created.ToString().c_str());
      return 1;
    }
    // Lock holds of the sessions' work only (CreateJob's planning of the
    // manifest comes before).
    constexpr char kHold[] = "sluice_coordinator_lock_hold_seconds";
    constexpr char kHoldCpu[] = "sluice_coordinator_lock_hold_cpu_seconds";
    const HoldBuckets holds_before =
        ScrapeLockHolds(coordinator->metrics_address, kHold);
    const HoldBuckets cpu_before =
        ScrapeLockHolds(coordinator->metrics_address, kHoldCpu);
    // A registered data server heartbeating through all of it.
    DataServerProbe data_server(coordinator->grpc_address);
    const absl::Time registering = absl::Now();
    while (!data_server.registered() &&
           absl::Now() - registering < absl::Seconds(10)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    const OpenResult sluice_open =
        OpenAll(coordinator->grpc_address, "big", ranks, workers,
                coordinator->process.pid(), true, coordinator->metrics_address);
    data_server.Stop();
    const LockHolds holds = HoldsBetween(
        holds_before, ScrapeLockHolds(coordinator->metrics_address, kHold));
    const LockHolds cpu_holds = HoldsBetween(
        cpu_before, ScrapeLockHolds(coordinator->metrics_address, kHoldCpu));
    // Which calls those were: the coordinator logs each hold over 1 ms of
    // CPU with the function that took the lock.
    std::map<std::string, int> slow_sites;
    {
      std::ifstream log(coordinator->log_path);
      const std::string marker = " held the state lock for ";
      for (std::string line; std::getline(log, line);) {
        const size_t at = line.find(marker);
        if (at == std::string::npos) continue;
        const size_t begin = line.rfind(' ', at - 1);
        ++slow_sites[line.substr(begin + 1, at - begin - 1)];
        std::fprintf(stderr, "  %d sessions, coordinator: %s\n", sessions,
                     line.c_str());
      }
    }
    std::string slow;
    for (const auto& [site, n] : slow_sites)
      absl::StrAppend(&slow, slow.empty() ? "" : ", ", site, " x", n);
    coordinator->process.Signal(SIGKILL);
    (void)coordinator->process.Wait(absl::Seconds(10));
    // A fresh baseline server per size, as the coordinator is: memory a
    // process kept from an earlier size would hide the next one's growth.
    std::string echo_address;
    auto echo =
        StartEchoServer(dir, sluice_open.heartbeat_interval_ms, &echo_address);
    if (!echo.ok()) {
      std::fprintf(stderr, "%s\n", echo.status().ToString().c_str());
      return 1;
    }
    const OpenResult bare =
        OpenAll(echo_address, "big", ranks, workers, echo->pid(), true);
    echo->Kill();
    const double ratio = sluice_open.open_s / std::max(bare.open_s, 1e-3);
    worst_ratio = std::max(worst_ratio, ratio);
    if (first) first_cpu_per_grant = sluice_open.cpu_us_per_grant;
    const double grant_cpu_ratio =
        sluice_open.cpu_us_per_grant / std::max(first_cpu_per_grant, 1e-9);
    worst_grant_cpu_ratio = std::max(worst_grant_cpu_ratio, grant_cpu_ratio);
    if (first) first_locked_per_grant = sluice_open.locked_cpu_us_per_grant;
    const double locked_ratio = sluice_open.locked_cpu_us_per_grant /
                                std::max(first_locked_per_grant, 1e-9);
    worst_locked_ratio = std::max(worst_locked_ratio, locked_ratio);
    // The same growth in bare gRPC: what the cost per grant gains with the
    // number of open streams when nothing but gRPC runs.
    if (first) first_bare_per_grant = bare.cpu_us_per_grant;
    const double bare_ratio =
        bare.cpu_us_per_grant / std::max(first_bare_per_grant, 1e-9);
    worst_bare_ratio = std::max(worst_bare_ratio, bare_ratio);
    std::printf(
        "%6d sessions: open %.2f s (bare gRPC %.2f s, %.1fx), %d of %d "
        "began; coordinator CPU %.2f s while opening; idle: heartbeats "
        "every %lld ms (%.0f/s), %.3f cores (%.1f us per session per s); RSS "
        "%.1f KB per session (bare gRPC %.1f KB); %lld leases expired; paced "
        "%.0f grants/s: "
        "%.0f us of coordinator CPU per grant (%.2fx the first size), %.1f "
        "us of it under the state lock (%.2fx the first size), bare gRPC "
        "%.0f us per grant (%.2fx its first size), grant "
        "latency p50 %.2f ms p99 %.2f ms; lock held %llu times, %llu of "
        "them over 1 ms, each under %g s (by the holder's CPU time: %llu "
        "over 1 ms, each under %g s%s%s); a data server's heartbeats: %lld "
        "acknowledged, longest %.1f ms, longest gap %.0f ms (timeout %.0f "
        "ms)\n",
        sessions, sluice_open.open_s, bare.open_s, ratio, sluice_open.opened,
        sessions, sluice_open.open_cpu_s,
        static_cast<long long>(sluice_open.heartbeat_interval_ms),
        sluice_open.heartbeats_per_s,
        sluice_open.idle_cpu_per_session_s * sessions,
        sluice_open.idle_cpu_per_session_s * 1e6,
        sluice_open.rss_kb_per_session, bare.rss_kb_per_session,
        static_cast<long long>(sluice_open.expired),
        sluice_open.paced_grants_per_s, sluice_open.cpu_us_per_grant,
        grant_cpu_ratio, sluice_open.locked_cpu_us_per_grant, locked_ratio,
        bare.cpu_us_per_grant, bare_ratio, sluice_open.grant_p50_ms,
        sluice_open.grant_p99_ms, static_cast<unsigned long long>(holds.count),
        static_cast<unsigned long long>(holds.over_1ms), holds.longest_under_s,
        static_cast<unsigned long long>(cpu_holds.over_1ms),
        cpu_holds.longest_under_s,
        slow.empty() ? "" : "; logged: ", slow.c_str(),
        static_cast<long long>(data_server.acks()),
        absl::ToDoubleMilliseconds(data_server.longest_ack()),
        absl::ToDoubleMilliseconds(data_server.longest_gap()),
        absl::ToDoubleMilliseconds(data_server.timeout()));
    std::fflush(stdout);
    absl::StrAppend(
        &json, first ? "" : ",", "{\"sessions\":", sessions,
        ",\"open_s\":", sluice_open.open_s, ",\"bare_open_s\":", bare.open_s,
        ",\"opened\":", sluice_open.opened,
        ",\"open_cpu_s\":", sluice_open.open_cpu_s,
        ",\"idle_cpu_us_per_session_s\":",
        sluice_open.idle_cpu_per_session_s * 1e6,
        ",\"idle_cores\":", sluice_open.idle_cpu_per_session_s * sessions,
        ",\"heartbeats_per_s\":", sluice_open.heartbeats_per_s,
        ",\"rss_kb_per_session\":", sluice_open.rss_kb_per_session,
        ",\"bare_rss_kb_per_session\":", bare.rss_kb_per_session,
        ",\"expired\":", sluice_open.expired,
        ",\"paced_grants_per_s\":", sluice_open.paced_grants_per_s,
        ",\"cpu_us_per_grant\":", sluice_open.cpu_us_per_grant,
        ",\"locked_cpu_us_per_grant\":", sluice_open.locked_cpu_us_per_grant,
        ",\"bare_cpu_us_per_grant\":", bare.cpu_us_per_grant,
        ",\"grant_p50_ms\":", sluice_open.grant_p50_ms,
        ",\"grant_p99_ms\":", sluice_open.grant_p99_ms,
        ",\"lock_holds\":", holds.count,
        ",\"lock_holds_over_1ms\":", holds.over_1ms,
        ",\"longest_lock_hold_under_s\":", holds.longest_under_s,
        ",\"lock_holds_over_1ms_cpu\":", cpu_holds.over_1ms,
        ",\"longest_lock_hold_cpu_under_s\":", cpu_holds.longest_under_s,
        ",\"data_server_acks\":", data_server.acks(),
        ",\"data_server_longest_ack_ms\":",
        absl::ToDoubleMilliseconds(data_server.longest_ack()),
        ",\"data_server_longest_gap_ms\":",
        absl::ToDoubleMilliseconds(data_server.longest_gap()),
        ",\"data_server_timeout_ms\":",
        absl::ToDoubleMilliseconds(data_server.timeout()), "}");
    first = false;
  }
  absl::StrAppend(&json, "],\"worst_open_ratio\":", worst_ratio,
                  ",\"worst_cpu_per_grant_ratio\":", worst_grant_cpu_ratio,
                  ",\"worst_locked_cpu_per_grant_ratio\":", worst_locked_ratio,
                  ",\"worst_bare_cpu_per_grant_ratio\":", worst_bare_ratio,
                  "}");
  std::printf("%s\n", json.c_str());
  return 0;
}

int main(int argc, char** argv) {
  // As the servers run (RunServerMain): without Abseil's mutex deadlock
  // detection, which Debian's Abseil leaves on. Its lock graph's lookups
  // grow with the number of live mutexes (a baseline server's per-stream
  // ones, gRPC's own), so a baseline with it would grow with the sessions
  // where the coordinator does not.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  absl::ParseCommandLine(argc, argv);
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "leases") return RunLeases();
  if (mode == "plan") return RunPlan();
  if (mode == "compaction") return RunCompaction();
  if (mode == "etcd") return RunEtcd();
  if (mode == "open") return RunOpen();
  if (mode == "echo_server") return RunEchoServer();
  if (mode == "grant_echo_server") return RunGrantEchoServer();
  if (mode == "remote_grants") return RunRemoteGrants();
  std::fprintf(stderr,
               "--mode must be leases, plan, etcd, open or remote_grants, not "
               "%s\n",
               mode.c_str());
  return 2;
}
