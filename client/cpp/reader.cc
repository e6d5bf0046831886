#include "sluice/reader.h"

#include <grpcpp/alarm.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/cpp/channel_credentials.h"
#include "client/cpp/cursor.h"
#include "client/cpp/fetch_turn.h"
#include "client/cpp/input_wait.h"
#include "client/cpp/lease_hold.h"
#include "client/cpp/report_ledger.h"
#include "client/cpp/reroute_backoff.h"
#include "server/common/backoff.h"
#include "server/common/clock.h"
#include "server/common/grpc_status.h"
#include "server/common/grpc_target.h"
#include "server/common/logging.h"
#include "server/common/tls_probe.h"
#include "sluice/v1/coordinator.grpc.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice {
namespace {

using client_internal::FetchTurnView;
using client_internal::InputWaitHistogram;
using client_internal::LeaseHold;
using client_internal::ReportLedger;
using client_internal::RerouteBackoff;
using v1::CoordinatorMessage;
using v1::TrainerMessage;

// What a unit reads, for counting failed streams: its shard, or its shuffle
// window's first shard.
const std::string& UnitKey(const v1::WorkUnit& unit) {
  return unit.pieces_size() > 0 ? unit.pieces(0).url() : unit.shard_url();
}

// Statuses after which reconnecting cannot help.
bool Terminal(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return true;
    default:
      return false;
  }
}

// Every asynchronous gRPC operation of a Reader completes on one completion
// queue, drained by one I/O thread that calls the operation's tag. A single
// thread waiting in gRPC matters: with several (a sync stream per thread),
// gRPC hands the poller role between them and each received message costs
// thread wake-ups on the way to its reader.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Done(bool ok) = 0;
};

// The session thread's blocking calls: start the operation with this tag,
// then Wait() for the I/O thread to complete it.
class WaitTag final : public Tag {
 public:
  void Done(bool ok) override {
    ok_ = ok;
    done_.Notify();
  }
  bool Wait() {
    done_.WaitForNotification();
    return ok_;
  }

 private:
  absl::Notification done_;
  bool ok_ = false;
};

// The void* gRPC carries for a tag, always through Tag* so RunIo's cast
// back is exact.
void* TagOf(Tag* tag) { return tag; }

using SessionStream =
    grpc::ClientAsyncReaderWriter<TrainerMessage, CoordinatorMessage>;

class ReaderImpl final : public Reader {
 public:
  explicit ReaderImpl(ReaderOptions options) : options_(std::move(options)) {
    if (options_.trainer_id.empty()) {
      char host[256] = {0};
      gethostname(host, sizeof(host) - 1);
      options_.trainer_id = absl::StrCat(host, "-", getpid(), "-r",
                                         options_.rank, "-w", options_.worker);
    }
    if (options_.units_in_flight < 1) options_.units_in_flight = 1;
    if (options_.buffer_samples < 1) options_.buffer_samples = 1;
    // gRPC's own reconnect backoff (up to 120 s) must not outlast a lease
    // TTL: a restarted coordinator keeps our leases only that long. (Not
    // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the time one
    // connection attempt may take, and a short one fails connects to a busy
    // server.)
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    channel_ = CoordinatorChannel(options_.coordinator, Creds(), args);
    coordinator_ = v1::Coordinator::NewStub(channel_);
  }

  ~ReaderImpl() override { Close(); }

  void Start() {
    io_thread_ = std::thread([this] { RunIo(); });
    session_thread_ = std::thread([this] { RunSession(); });
    maintenance_thread_ = std::thread([this] { RunMaintenance(); });
  }

  absl::StatusOr<ReaderEvent> Next() override;
  ReaderStats stats() const override {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  void Close() override;
  absl::StatusOr<v1::Cursor> Cursor() override;

 private:
  struct Unit;
  // A step of a unit's ReadSamples stream, completed on the I/O thread.
  class FetchTag final : public Tag {
   public:
    enum class Op { kStart, kRead, kFinish, kRetryAfter };
    FetchTag(ReaderImpl* reader, Unit* unit, Op op)
        : reader_(reader), unit_(unit), op_(op) {}
    void Done(bool ok) override { reader_->OnFetchEvent(*unit_, op_, ok); }

   private:
    ReaderImpl* reader_;
    Unit* unit_;
    Op op_;
  };
  struct Unit {
    explicit Unit(ReaderImpl* reader)
        : start_tag(reader, this, FetchTag::Op::kStart),
          read_tag(reader, this, FetchTag::Op::kRead),
          finish_tag(reader, this, FetchTag::Op::kFinish),
          retry_tag(reader, this, FetchTag::Op::kRetryAfter) {}
    Unit(const Unit&) = delete;
    Unit& operator=(const Unit&) = delete;
    v1::Lease lease;
    int64_t order = 0;  // grant order: reports go out in this order
    int64_t size = 0;
    std::deque<Sample> buffer;
    int64_t next_fetch = 0;          // absolute sample index
    int64_t last_batch_samples = 0;  // size of the newest batch received
    enum class Fetch { kRunning, kDone, kFailed } fetch = Fetch::kRunning;
    std::string fetch_error;
    bool dropped = false;
    int64_t delivered = 0;
    int64_t reported = 0;
    std::optional<TrainerMessage> final_report;  // Complete / Reroute / Release
    absl::Time last_activity;  // last message from the data server
    bool stalled = false;
    // The unit's ReadSamples stream, a small state machine driven by the I/O
    // thread (OnFetchEvent); at most one operation outstanding at a time.
    bool fetch_started = false;     // stream opened (or the retry alarm armed)
    bool op_pending = false;        // StartCall or Read outstanding
    bool waiting_for_room = false;  // no Read issued: the buffer is full
    bool cancelled = false;         // TryCancel'ed: no further Read
    bool finishing = false;         // Finish issued
    bool call_done = false;         // Finish (or the retry alarm) completed
    v1::ReadRequest request;
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientAsyncReader<v1::SampleBatch>> stream;
    v1::SampleBatch batch;  // the outstanding Read's target
    grpc::Status status;    // Finish's
    std::string protocol_error;
    // Armed instead of failing at once: no live data server, or a back-off
    // before re-routing (see OnFetchFinished); fails with retry_error.
    std::unique_ptr<grpc::Alarm> retry_alarm;
    std::string retry_error;
    // Keeps the unit alive while an operation is outstanding.
    std::shared_ptr<Unit> io_hold;
    FetchTag start_tag, read_tag, finish_tag, retry_tag;
  };
  struct Entry {
    ReaderEvent::Kind kind;
    int64_t epoch = 0, samples = 0, already = 0;
    std::shared_ptr<Unit> unit;  // null for markers
    int64_t worker_samples = 0, worker_already = 0;
    std::string message;  // kDone
  };

  std::shared_ptr<grpc::ChannelCredentials> Creds() const {
    return client_internal::ChannelCredentials(options_.tls);
  }

  // Blocking writes on the session stream, one at a time (write_mu_).
  bool Send(const TrainerMessage& m) {
    absl::MutexLock lock(&write_mu_);
    if (stream_ == nullptr) return false;
    WaitTag written;
    stream_->Write(m, TagOf(&written));
    return written.Wait();
  }
  // Sends Sync{id} with the next id; ids go out in increasing order, so a
  // Synced{n} confirms every Sync below n too. Returns 0 if not sent.
  uint64_t SendSync() {
    absl::MutexLock lock(&write_mu_);
    if (stream_ == nullptr) return 0;
    TrainerMessage sync;
    {
      absl::MutexLock state(&mu_);
      sync.mutable_sync()->set_id(ledger_.NextSyncId());
    }
    WaitTag written;
    stream_->Write(sync, TagOf(&written));
    return written.Wait() ? sync.sync().id() : 0;
  }

  void RunIo() {
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) static_cast<Tag*>(tag)->Done(ok);
  }
  void RunSession();
  void Handle(const CoordinatorMessage& m);
  void RunMaintenance();
  // Fails the reader when a data server whose stream failed speaks TLS and
  // this reader plaintext, or the reverse.
  void CheckDataServerTransports();
  // The fetch state machine. Start: StartCall, then Read after Read while
  // the unit's buffer has room (the consumer re-issues the Read it skipped
  // once room appears), then Finish once a Read fails (end of stream or
  // cancelled); Finish's status decides the unit's fate.
  void StartEligibleFetchesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFetchLocked(const std::shared_ptr<Unit>& u)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFetchEvent(Unit& u, FetchTag::Op op, bool ok);
  void OnBatch(Unit& u, bool ok);
  void OnFetchFinished(Unit& u);
  void IssueReadLocked(Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    u.op_pending = true;
    u.waiting_for_room = false;
    u.stream->Read(&u.batch, TagOf(&u.read_tag));
  }
  void BeginFinishLocked(Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (u.finishing) return;
    u.finishing = true;
    u.stream->Finish(&u.status, TagOf(&u.finish_tag));
  }
  // Stops a unit's stream: its outstanding operation fails, then Finish.
  void CancelFetchLocked(Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    u.cancelled = true;
    if (!u.fetch_started || u.call_done) return;
    if (u.retry_alarm != nullptr) {
      u.retry_alarm->Cancel();
      return;
    }
    u.ctx->TryCancel();
    if (!u.op_pending) BeginFinishLocked(u);
  }
  void SetFetchStateLocked(Unit& u, Unit::Fetch state, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (u.fetch == Unit::Fetch::kRunning) {
      u.fetch = state;
      u.fetch_error = error;
    }
  }
  // Sends final reports, and Progress for units with new deliveries when
  // `progress` is set.
  // `force`: a Progress for every live unit, even without new deliveries
  // (after a reconnect, so the coordinator confirms or rejects each lease).
  void FlushReports(bool progress, bool force = false);
  void DropLocked(Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    u.dropped = true;
    u.buffer.clear();
    CancelFetchLocked(u);
    NotifyAllLocked();
  }
  // The lease is no longer ours (Revoke, Rejected): drop what is undelivered
  // and report nothing more for it.
  void RetireLocked(const std::string& lease_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = units_.find(lease_id);
    if (it == units_.end()) return;
    DropLocked(*it->second);
    it->second->final_report.reset();
    retired_.push_back(it->second);
    units_.erase(it);
  }
  // The turn rule (fetch_turn.h) over the units held.
  bool FetchMayStartLocked(const Unit& u) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    turn_views_.clear();
    for (const auto& [id, other] : units_) {
      const Unit& o = *other;
      turn_views_.push_back(FetchTurnView{
          o.order, o.lease.data_server(),
          !o.dropped && o.fetch == Unit::Fetch::kRunning &&
              o.retry_alarm == nullptr,
          o.lease.unit().end() - o.next_fetch, o.last_batch_samples});
    }
    return client_internal::FetchMayStart(
        FetchTurnView{u.order, u.lease.data_server(), false, 0, 0},
        turn_views_);
  }

  ReaderOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;

  mutable absl::Mutex mu_;
  // Wait queues on mu_, so the per-batch hand-off wakes only the consumer
  // (data_cv_, Next); cv_ is for the session, Cursor and Close, and the
  // maintenance thread sleeps on its own timer. A state change off the hot
  // path wakes the first two and opens the streams whose turn has come
  // (NotifyAllLocked).
  absl::CondVar cv_;
  absl::CondVar data_cv_;
  absl::CondVar
      maintenance_cv_;  // the maintenance thread's timer; woken on closing
  void NotifyAllLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    StartEligibleFetchesLocked();
    cv_.SignalAll();
    data_cv_.SignalAll();
    if (closing_) maintenance_cv_.Signal();
  }
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Unit>> units_ ABSL_GUARDED_BY(mu_);
  // Final reports not yet known to be durable, and the Sync ids.
  ReportLedger ledger_ ABSL_GUARDED_BY(mu_);
  // The timing rules read this clock.
  const Clock* const clock_ = Clock::Real();
  // Whether delivery waits for the coordinator to confirm held leases.
  LeaseHold hold_ ABSL_GUARDED_BY(mu_){clock_};
  std::vector<FetchTurnView> turn_views_ ABSL_GUARDED_BY(mu_);
  // Units no longer in units_ whose stream may still have an operation
  // outstanding.
  std::vector<std::shared_ptr<Unit>> retired_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<v1::DataServer::Stub>> data_stubs_
      ABSL_GUARDED_BY(mu_);
  absl::Status fatal_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool job_done_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_epoch_begin_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t last_epoch_end_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t world_size_ ABSL_GUARDED_BY(mu_) = 0;
  // A job with sources: their names as its leases named them ("" = not
  // seen yet), for cursors.
  std::vector<std::string> source_names_ ABSL_GUARDED_BY(mu_);
  bool resume_done_ ABSL_GUARDED_BY(mu_) =
      false;  // the cursor reached a Welcome
  bool stream_open_ ABSL_GUARDED_BY(mu_) = false;
  // Consumer-side position (the thread calling Next()).
  int64_t position_epoch_ = -1;
  int64_t position_consumed_ = 0;
  // One flush at a time, so reports of one lease never overtake each other.
  absl::Mutex flush_mu_;
  ReaderStats stats_ ABSL_GUARDED_BY(mu_);

  // Streams that failed in a row, per (data server, UnitKey).
  RerouteBackoff reroute_backoff_ ABSL_GUARDED_BY(mu_);
  // Data servers whose streams failed UNAVAILABLE, to be asked whether they
  // speak TLS (each once; by the maintenance thread, outside the lock).
  std::set<std::string> transport_checked_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> transport_checks_ ABSL_GUARDED_BY(mu_);
  static constexpr absl::Duration kTransportCheckPeriod = absl::Seconds(5);
  // The consumer's waits for samples since the last heartbeat.
  InputWaitHistogram input_wait_ ABSL_GUARDED_BY(mu_);

  absl::Mutex write_mu_;
  SessionStream* stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  grpc::ClientContext* session_ctx_ ABSL_GUARDED_BY(write_mu_) = nullptr;

  grpc::CompletionQueue
      cq_;  // every stream's operations; drained by io_thread_
  std::thread io_thread_;
  std::thread session_thread_;
  std::thread maintenance_thread_;
};

absl::StatusOr<ReaderEvent> ReaderImpl::Next() {
  // The input wait of the sample this call returns: 0 unless it blocks,
  // timed from its first wait (no clock read on the buffered path).
  absl::Time waiting_since = absl::InfinitePast();
  bool waited = false;
  auto start_waiting = [&] {
    if (!waited) waiting_since = absl::Now();
    waited = true;
  };
  while (true) {
    ReaderEvent event;
    bool flush = false;
    bool have_event = false;
    {
      absl::MutexLock lock(&mu_);
      while (!have_event && !flush) {
        if (!fatal_.ok()) return fatal_;
        if (closed_) return absl::CancelledError("reader closed");
        if (entries_.empty()) {
          start_waiting();
          data_cv_.Wait(&mu_);
          continue;
        }
        Entry& e = entries_.front();
        if (e.unit == nullptr) {
          event.kind = e.kind;
          event.epoch = e.epoch;
          event.samples_for_rank = e.samples;
          event.already_consumed = e.already;
          event.samples_for_worker = e.worker_samples;
          event.already_consumed_by_worker = e.worker_already;
          event.message = e.message;
          if (e.kind != ReaderEvent::Kind::kDone)
            entries_.pop_front();  // Done stays
          have_event = true;
          break;
        }
        Unit& u = *e.unit;
        if (u.dropped) {
          ++stats_.dropped_units;
          entries_.pop_front();
          continue;
        }
        if (!u.buffer.empty() && hold_.MayHaveLostLeases()) {
          // Our leases may have expired at the coordinator (and been
          // granted to others): deliver nothing until it confirms them.
          start_waiting();
          data_cv_.WaitWithDeadline(&mu_, absl::Now() + absl::Milliseconds(50));
          continue;
        }
        if (!u.buffer.empty()) {
          event.kind = ReaderEvent::Kind::kSample;
          event.sample = std::move(u.buffer.front());
          event.epoch = event.sample.epoch;
          u.buffer.pop_front();
          // The stream skipped its next Read on a full buffer: room now.
          if (u.waiting_for_room && !u.cancelled && !u.dropped && !closing_ &&
              static_cast<int>(u.buffer.size()) < options_.buffer_samples) {
            u.last_activity = absl::Now();
            IssueReadLocked(u);
          }
          ++u.delivered;
          ++stats_.delivered;
          const double wait =
              waited ? absl::ToDoubleSeconds(absl::Now() - waiting_since) : 0;
          input_wait_.Observe(wait);
          stats_.input_wait_seconds += wait;
          have_event = true;
          if (u.delivered == u.size) {
            TrainerMessage m;
            m.mutable_complete()->set_lease_id(u.lease.lease_id());
            m.mutable_complete()->set_fence(u.lease.fence());
            u.final_report = m;
            ++stats_.units_completed;
            entries_.pop_front();
            flush = true;
          }
          break;
        }
        if (u.fetch == Unit::Fetch::kFailed) {
          // Everything fetched has been delivered: hand the rest back for a
          // re-route, counting exactly what was consumed.
          TrainerMessage m;
          m.mutable_reroute()->set_lease_id(u.lease.lease_id());
          m.mutable_reroute()->set_fence(u.lease.fence());
          m.mutable_reroute()->set_consumed(u.delivered);
          m.mutable_reroute()->set_failed_data_server(u.lease.data_server());
          m.mutable_reroute()->set_error(u.fetch_error);
          u.final_report = m;
          ++stats_.reroutes;
          entries_.pop_front();
          flush = true;
          break;
        }
        start_waiting();
        data_cv_.Wait(&mu_);
      }
    }
    if (flush) FlushReports(false);
    if (have_event) {
      if (event.kind == ReaderEvent::Kind::kEpochBegin) {
        position_epoch_ = event.epoch;
        position_consumed_ = options_.num_workers > 1
                                 ? event.already_consumed_by_worker
                                 : event.already_consumed;
      } else if (event.kind == ReaderEvent::Kind::kSample) {
        ++position_consumed_;
      }
      return event;
    }
  }
}

void ReaderImpl::FlushReports(bool progress, bool force) {
  absl::MutexLock flush_lock(&flush_mu_);
  std::vector<std::pair<std::shared_ptr<Unit>, TrainerMessage>> out;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, u] : units_) {
      if (u->final_report.has_value()) {
        out.emplace_back(u, *u->final_report);
      } else if (progress && !u->dropped &&
                 (u->delivered > u->reported || force)) {
        TrainerMessage m;
        m.mutable_progress()->set_lease_id(u->lease.lease_id());
        m.mutable_progress()->set_fence(u->lease.fence());
        m.mutable_progress()->set_consumed(u->delivered);
        out.emplace_back(u, m);
      }
    }
  }
  // In delivery order: the coordinator's per-rank acknowledgement order is
  // what a resume cursor counts in.
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first->order < b.first->order;
  });
  for (auto& [u, m] : out) {
    if (!Send(m)) return;  // disconnected: the session re-flushes on reconnect
    absl::MutexLock lock(&mu_);
    if (m.has_progress()) {
      u->reported = std::max(u->reported, m.progress().consumed());
    } else {
      ledger_.Sent(u->lease.lease_id(), m, u->order);
      units_.erase(u->lease.lease_id());
      CancelFetchLocked(*u);
      retired_.push_back(u);
      NotifyAllLocked();
    }
  }
}

void ReaderImpl::RunSession() {
  // Retries stay well within a lease TTL: a restarted coordinator gives
  // the leases a fresh TTL and keeps them only if we are back before it
  // ends.
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(5));
  absl::Time unreachable_since = absl::Now();
  absl::Time next_transport_check = absl::InfinitePast();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (closing_ || job_done_) return;
    }
    // Connect first (polling the connection up to once per retry period,
    // the channel's backoff capped as above), then open the stream.
    if (!channel_->WaitForConnected(absl::ToChronoTime(
            absl::Now() + std::min(backoff.step() * 5, absl::Seconds(1))))) {
      // A client and coordinator that disagree about TLS fail every connect
      // the same way: say so instead of retrying until the timeout.
      absl::Status mismatch;
      if (absl::Now() >= next_transport_check) {
        next_transport_check = absl::Now() + kTransportCheckPeriod;
        mismatch =
            CheckTransport("coordinator", options_.coordinator,
                           options_.tls.has_value(), "ReaderOptions::tls");
      }
      absl::MutexLock lock(&mu_);
      if (!mismatch.ok()) {
        fatal_ = mismatch;
        NotifyAllLocked();
        return;
      }
      if (closing_ || job_done_) return;
      if (absl::Now() - unreachable_since > options_.reconnect_timeout) {
        fatal_ = absl::UnavailableError(absl::StrCat(
            "coordinator ", options_.coordinator, " unreachable for ",
            absl::FormatDuration(options_.reconnect_timeout)));
        NotifyAllLocked();
        return;
      }
      backoff.set_max(std::min(absl::Seconds(5), hold_.lease_ttl() / 4));
      backoff.Grow();
      continue;
    }
    grpc::ClientContext ctx;
    std::unique_ptr<SessionStream> stream =
        coordinator_->PrepareAsyncSession(&ctx, &cq_);
    {
      absl::MutexLock lock(&write_mu_);
      session_ctx_ = &ctx;  // Close() can cancel from here on
    }
    WaitTag started;
    stream->StartCall(TagOf(&started));
    const bool started_ok = started.Wait();
    auto read = [&stream](CoordinatorMessage* m) {
      WaitTag done;
      stream->Read(m, TagOf(&done));
      return done.Wait();
    };
    {
      absl::MutexLock lock(&write_mu_);
      stream_ = stream.get();
    }
    {
      absl::MutexLock lock(&mu_);
      if (closing_) ctx.TryCancel();
      stream_open_ = true;
    }
    TrainerMessage hello;
    hello.mutable_hello()->set_job(options_.job);
    hello.mutable_hello()->set_rank(options_.rank);
    hello.mutable_hello()->set_worker(options_.worker);
    hello.mutable_hello()->set_num_workers(options_.num_workers);
    hello.mutable_hello()->set_trainer_id(options_.trainer_id);
    {
      absl::MutexLock lock(&mu_);
      if (options_.resume_from.has_value() && !resume_done_) {
        *hello.mutable_hello()->mutable_cursor() = *options_.resume_from;
        hello.mutable_hello()->set_resume_attempt(options_.resume_attempt);
      }
    }
    TrainerMessage want;
    want.mutable_want()->set_credits(options_.units_in_flight);
    bool welcomed = false;
    if (started_ok) {
      // A write fails when the coordinator has already ended the stream (a
      // finished job: Welcome, JobDone, OK right after the Hello). Its
      // messages are read all the same: they say why, and Finish() waits
      // for every incoming message to be read.
      if (Send(hello)) Send(want);
      CoordinatorMessage m;
      while (read(&m)) {
        if (m.has_welcome() && !welcomed) {
          welcomed = true;
          backoff.Reset();
          Handle(m);
          // Re-send what a broken stream may have lost, and have every held
          // lease confirmed: a lease the coordinator no longer knows is
          // Rejected (before the Synced), and its rest is never delivered.
          // Finals the old coordinator may never have made durable first,
          // in delivery order; then every live unit's position.
          std::vector<TrainerMessage> finals;
          {
            absl::MutexLock lock(&mu_);
            finals = ledger_.Unconfirmed();
          }
          for (const TrainerMessage& f : finals) Send(f);
          FlushReports(true, /*force=*/true);
          const uint64_t id = SendSync();
          {
            absl::MutexLock lock(&mu_);
            hold_.Reconnected(id);
          }
          continue;
        }
        Handle(m);
      }
    }
    {
      absl::MutexLock lock(&write_mu_);
      stream_ = nullptr;
      session_ctx_ = nullptr;
    }
    {
      absl::MutexLock lock(&mu_);
      stream_open_ = false;
      hold_.Disconnected();
      NotifyAllLocked();
    }
    grpc::Status finish_status;
    {
      WaitTag finished;
      stream->Finish(&finish_status, TagOf(&finished));
      finished.Wait();
    }
    absl::Status status = FromGrpcStatus(finish_status);
    absl::MutexLock lock(&mu_);
    if (closing_ || job_done_) return;
    if (Terminal(status)) {
      fatal_ = status;
      NotifyAllLocked();
      return;
    }
    if (welcomed) {
      unreachable_since = absl::Now();
      ++stats_.reconnects;
    }
    if (absl::Now() - unreachable_since > options_.reconnect_timeout) {
      fatal_ = absl::UnavailableError(absl::StrCat(
          "coordinator ", options_.coordinator, " unreachable for ",
          absl::FormatDuration(options_.reconnect_timeout), ": ",
          status.ToString()));
      NotifyAllLocked();
      return;
    }
    backoff.set_max(std::min(absl::Seconds(5), hold_.lease_ttl() / 4));
    const absl::Time until = absl::Now() + backoff.NextWait();
    while (!closing_ && absl::Now() < until) cv_.WaitWithDeadline(&mu_, until);
  }
}

void ReaderImpl::Handle(const CoordinatorMessage& m) {
  std::optional<TrainerMessage> resend;
  {
    absl::MutexLock lock(&mu_);
    switch (m.msg_case()) {
      case CoordinatorMessage::kWelcome:
        if (m.welcome().heartbeat_interval_ms() > 0) {
          heartbeat_interval_ =
              absl::Milliseconds(m.welcome().heartbeat_interval_ms());
        }
        world_size_ = m.welcome().world_size();
        if (m.welcome().lease_ttl_ms() > 0) {
          hold_.set_lease_ttl(absl::Milliseconds(m.welcome().lease_ttl_ms()));
        }
        resume_done_ = true;
        break;
      case CoordinatorMessage::kSynced:
        ledger_.Synced(m.synced().id());
        hold_.Synced(ledger_.synced());
        break;
      case CoordinatorMessage::kEpochBegin:
        if (m.epoch_begin().epoch() > last_epoch_begin_) {
          last_epoch_begin_ = m.epoch_begin().epoch();
          entries_.push_back(Entry{ReaderEvent::Kind::kEpochBegin,
                                   m.epoch_begin().epoch(),
                                   m.epoch_begin().samples_for_rank(),
                                   m.epoch_begin().already_consumed(),
                                   nullptr,
                                   m.epoch_begin().samples_for_worker(),
                                   m.epoch_begin().already_consumed_by_worker(),
                                   {}});
        }
        break;
      case CoordinatorMessage::kEpochEnd:
        if (m.epoch_end().epoch() > last_epoch_end_) {
          last_epoch_end_ = m.epoch_end().epoch();
          entries_.push_back(Entry{ReaderEvent::Kind::kEpochEnd,
                                   m.epoch_end().epoch(),
                                   0,
                                   0,
                                   nullptr,
                                   0,
                                   0,
                                   {}});
        }
        break;
      case CoordinatorMessage::kJobDone:
        job_done_ = true;
        entries_.push_back(Entry{ReaderEvent::Kind::kDone,
                                 m.job_done().num_epochs(), 0, 0, nullptr, 0, 0,
                                 m.job_done().message()});
        break;
      case CoordinatorMessage::kGrant: {
        const v1::Lease& lease = m.grant().lease();
        // A unit names the sources it reads: learn the names as they come.
        const v1::WorkUnit& unit = lease.unit();
        if (unit.mix_samples_size() > 0) {
          source_names_.resize(
              std::max<size_t>(source_names_.size(), unit.mix_samples_size()));
          for (const v1::MixSegment& seg : unit.segments()) {
            if (seg.source() >= 0 && seg.source() < unit.mix_samples_size())
              source_names_[seg.source()] = seg.source_name();
          }
        }
        if (const TrainerMessage* final = ledger_.Find(lease.lease_id())) {
          resend = *final;  // re-announced after a reconnect
          break;
        }
        if (auto held = units_.find(lease.lease_id()); held != units_.end()) {
          // Sent again (a reconnect, or a token near its expiry): streams
          // opened from now on present the new token.
          if (held->second->lease.fence() == lease.fence())
            held->second->lease = lease;
          break;
        }
        if (closing_) break;
        auto u = std::make_shared<Unit>(this);
        u->lease = lease;
        u->size = lease.unit().end() - lease.unit().begin();
        u->next_fetch = lease.unit().begin();
        u->order = next_order_++;
        units_[lease.lease_id()] = u;
        entries_.push_back(
            Entry{ReaderEvent::Kind::kSample, 0, 0, 0, u, 0, 0, {}});
        break;  // its stream opens in NotifyAllLocked below, when its turn
                // comes
      }
      case CoordinatorMessage::kRevoke:
        RetireLocked(m.revoke().lease_id());
        break;
      case CoordinatorMessage::kRejected:
        RetireLocked(m.rejected().lease_id());
        break;
      default:
        break;
    }
    NotifyAllLocked();
  }
  if (resend.has_value()) Send(*resend);
}

void ReaderImpl::StartEligibleFetchesLocked() {
  if (closing_) return;
  std::vector<const std::shared_ptr<Unit>*> waiting;
  for (const auto& [id, u] : units_) {
    if (!u->fetch_started && !u->dropped && !u->cancelled)
      waiting.push_back(&u);
  }
  std::sort(waiting.begin(), waiting.end(), [](const auto* a, const auto* b) {
    return (*a)->order < (*b)->order;
  });
  for (const auto* u : waiting) {
    if (FetchMayStartLocked(**u)) StartFetchLocked(*u);
  }
}

void ReaderImpl::StartFetchLocked(const std::shared_ptr<Unit>& unit) {
  Unit& u = *unit;
  u.fetch_started = true;
  u.io_hold = unit;
  const std::string& address = u.lease.data_server();
  if (address.empty()) {
    // No live data server: wait a little, then ask for a re-route.
    u.retry_error = "no live data server";
    u.retry_alarm = std::make_unique<grpc::Alarm>();
    u.retry_alarm->Set(
        &cq_, absl::ToChronoTime(absl::Now() + absl::Milliseconds(500)),
        TagOf(&u.retry_tag));
    return;
  }
  auto& stub = data_stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub = v1::DataServer::NewStub(
        grpc::CreateCustomChannel(address, Creds(), args));
  }
  *u.request.mutable_lease() = u.lease;
  *u.request.mutable_decode() = options_.decode;
  for (const std::string& f : options_.fields) u.request.add_fields(f);
  u.request.set_max_batch_bytes(options_.max_batch_bytes);
  u.request.set_start(u.next_fetch);
  u.ctx = std::make_unique<grpc::ClientContext>();
  u.last_activity = absl::Now();
  u.stream = stub->PrepareAsyncReadSamples(u.ctx.get(), u.request, &cq_);
  u.op_pending = true;
  u.stream->StartCall(TagOf(&u.start_tag));
}

void ReaderImpl::OnFetchEvent(Unit& u, FetchTag::Op op, bool ok) {
  switch (op) {
    case FetchTag::Op::kStart: {
      absl::MutexLock lock(&mu_);
      u.op_pending = false;
      if (!ok || u.cancelled || u.dropped || closing_) {
        BeginFinishLocked(u);
      } else {
        IssueReadLocked(u);
      }
      return;
    }
    case FetchTag::Op::kRead:
      OnBatch(u, ok);
      return;
    case FetchTag::Op::kFinish:
      OnFetchFinished(u);
      return;
    case FetchTag::Op::kRetryAfter: {
      std::shared_ptr<Unit> hold;  // released after the lock
      absl::MutexLock lock(&mu_);
      hold = std::move(u.io_hold);
      u.call_done = true;
      if (!u.dropped && !closing_)
        SetFetchStateLocked(u, Unit::Fetch::kFailed, u.retry_error);
      NotifyAllLocked();
      return;
    }
  }
}

void ReaderImpl::OnBatch(Unit& u, bool ok) {
  if (!ok) {  // end of stream, or cancelled: Finish tells which
    absl::MutexLock lock(&mu_);
    u.op_pending = false;
    BeginFinishLocked(u);
    return;
  }
  // Convert outside the lock (the batch belongs to this Read until it is
  // re-issued), then hand it over in one step.
  std::vector<Sample> converted;
  converted.reserve(static_cast<size_t>(u.batch.samples_size()));
  for (v1::Sample& s : *u.batch.mutable_samples()) {
    Sample out;
    out.epoch = u.lease.epoch();
    out.rank = u.lease.rank();
    const v1::WorkUnit& unit = u.lease.unit();
    if (unit.pieces_size() > 0) {
      // A shuffle window: each sample names its shard (a piece index the
      // unit does not have is clamped; the data server sets it).
      const int piece = std::clamp(s.piece(), 0, unit.pieces_size() - 1);
      out.shard_index = unit.pieces(piece).shard_index();
      out.shard_url = unit.pieces(piece).url();
      // A mixed unit: the piece's source, named by its segments.
      for (const v1::MixSegment& seg : unit.segments()) {
        if (seg.source() == unit.pieces(piece).source()) {
          out.source = seg.source_name();
          break;
        }
      }
    } else {
      out.shard_index = unit.shard_index();
      out.shard_url = unit.shard_url();
    }
    out.data_server = u.lease.data_server();
    out.index = s.index();
    out.key = std::move(*s.mutable_key());
    out.skipped = s.skipped();
    out.skip_reason = std::move(*s.mutable_skip_reason());
    out.fields.reserve(static_cast<size_t>(s.fields_size()));
    for (v1::Field& f : *s.mutable_fields()) out.fields.push_back(std::move(f));
    converted.push_back(std::move(out));
  }
  absl::MutexLock lock(&mu_);
  u.op_pending = false;
  u.last_activity = absl::Now();
  if (u.dropped || closing_) {
    u.ctx->TryCancel();
    BeginFinishLocked(u);
    return;
  }
  // A plain unit's samples come with their positions (their index in the
  // shard); a window's with their index in their own shard, so only count.
  const bool window = u.lease.unit().pieces_size() > 0;
  for (Sample& out : converted) {
    if (!window && out.index != u.next_fetch) {
      u.protocol_error =
          absl::StrCat("data server ", u.lease.data_server(), " sent sample ",
                       out.index, ", expected ", u.next_fetch);
      u.cancelled = true;
      u.ctx->TryCancel();
      BeginFinishLocked(u);
      data_cv_.Signal();
      return;
    }
    u.buffer.push_back(std::move(out));
    ++u.next_fetch;
  }
  u.last_batch_samples = static_cast<int64_t>(converted.size());
  reroute_backoff_.Succeeded(u.lease.data_server(), UnitKey(u.lease.unit()));
  data_cv_.Signal();
  if (u.cancelled) {
    BeginFinishLocked(u);
  } else if (static_cast<int>(u.buffer.size()) < options_.buffer_samples ||
             u.next_fetch >= u.lease.unit().end()) {
    IssueReadLocked(u);  // at the end, this Read sees the end of the stream
  } else {
    u.waiting_for_room = true;  // Next() re-issues it
  }
  StartEligibleFetchesLocked();  // the next unit's turn comes near this one's
                                 // end
}

void ReaderImpl::OnFetchFinished(Unit& u) {
  std::shared_ptr<Unit> hold;  // released after the lock
  absl::MutexLock lock(&mu_);
  hold = std::move(u.io_hold);
  u.call_done = true;
  const absl::Status status = FromGrpcStatus(u.status);
  const std::string& address = u.lease.data_server();
  if (u.dropped || closing_) {
    // Nothing more to deliver or report.
  } else if (!u.protocol_error.empty()) {
    SetFetchStateLocked(u, Unit::Fetch::kFailed, u.protocol_error);
  } else if (u.next_fetch == u.lease.unit().end()) {
    // Everything arrived; a status after the last sample (a cancel once
    // the unit was reported) does not matter.
    SetFetchStateLocked(u, Unit::Fetch::kDone, "");
  } else if (status.ok()) {
    SetFetchStateLocked(u, Unit::Fetch::kFailed, "stream ended early");
  } else if (status.code() == absl::StatusCode::kAborted) {
    DropLocked(u);  // a newer grant of the unit exists: deliver nothing more
  } else if (status.code() == absl::StatusCode::kDataLoss ||
             status.code() == absl::StatusCode::kOutOfRange ||
             status.code() == absl::StatusCode::kInvalidArgument ||
             status.code() == absl::StatusCode::kPermissionDenied) {
    // Not a server fault: corrupt data under on_corrupt=fail, or a manifest
    // / configuration that does not match the shards.
    fatal_ = absl::Status(
        status.code(),
        absl::StrCat("lease ", u.lease.lease_id(), ": ", status.message()));
  } else {
    std::string error =
        u.stalled ? absl::StrCat(address, ": no data for ",
                                 absl::FormatDuration(options_.stall_timeout))
                  : absl::StrCat(address, ": ", status.ToString());
    if (status.code() == absl::StatusCode::kUnavailable &&
        transport_checked_.insert(address).second) {
      transport_checks_.push_back(address);  // the maintenance thread probes
      maintenance_cv_.Signal();
    }
    // A shard whose streams keep failing is re-routed with back-off
    // (reroute_backoff.h).
    const RerouteBackoff::Decision reroute =
        reroute_backoff_.Failed(address, UnitKey(u.lease.unit()));
    if (reroute.log) {
      LogWarning(
          "sluice::Reader job %s rank %d: stream %d in a row from %s failed, "
          "re-routing: %s",
          options_.job, options_.rank, reroute.failures_in_a_row, address,
          error);
    }
    if (reroute.wait > absl::ZeroDuration()) {
      u.retry_error = std::move(error);
      u.retry_alarm = std::make_unique<grpc::Alarm>();
      u.retry_alarm->Set(&cq_, absl::ToChronoTime(absl::Now() + reroute.wait),
                         TagOf(&u.retry_tag));
      u.call_done = false;  // the alarm is outstanding
      u.io_hold = std::move(hold);
      return;
    }
    SetFetchStateLocked(u, Unit::Fetch::kFailed, error);
  }
  NotifyAllLocked();
}

void ReaderImpl::RunMaintenance() {
  absl::Time last_heartbeat = absl::InfinitePast();
  while (true) {
    absl::Duration heartbeat;
    std::vector<std::shared_ptr<Unit>> finished;  // freed outside the lock
    {
      absl::MutexLock lock(&mu_);
      heartbeat = heartbeat_interval_;
      absl::Time until =
          absl::Now() + std::min({heartbeat, options_.progress_interval,
                                  options_.stall_timeout / 2});
      while (!closing_ && absl::Now() < until)
        maintenance_cv_.WaitWithDeadline(&mu_, until);
      if (closing_) return;
      // Streams that went quiet: cancel them, the unit is then re-routed.
      const absl::Time now = absl::Now();
      for (auto& [id, u] : units_) {
        if (u->fetch_started && !u->call_done && !u->cancelled &&
            u->retry_alarm == nullptr && u->fetch == Unit::Fetch::kRunning &&
            !u->stalled && !u->waiting_for_room &&
            now - u->last_activity > options_.stall_timeout) {
          u->stalled = true;
          CancelFetchLocked(*u);
        }
      }
      for (auto it = retired_.begin(); it != retired_.end();) {
        if (!(*it)->fetch_started || (*it)->call_done) {
          finished.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          ++it;
        }
      }
    }
    finished.clear();
    CheckDataServerTransports();
    if (absl::Now() - last_heartbeat >= heartbeat) {
      bool unconfirmed;
      {
        absl::MutexLock lock(&mu_);
        unconfirmed = !ledger_.empty();
      }
      // A Sync renews like a heartbeat and lets confirmed finals go; a
      // heartbeat carries the consumer's input wait since the last one (one
      // message per interval either way).
      if (unconfirmed) {
        if (SendSync() != 0) last_heartbeat = absl::Now();
      } else {
        TrainerMessage beat;
        {
          absl::MutexLock lock(&mu_);
          input_wait_.Take(beat.mutable_heartbeat()->mutable_input_wait());
        }
        if (Send(beat)) last_heartbeat = absl::Now();
      }
    }
    FlushReports(true);
  }
}

void ReaderImpl::CheckDataServerTransports() {
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    addresses.swap(transport_checks_);
  }
  for (const std::string& address : addresses) {
    absl::Status mismatch = CheckTransport(
        "data server", address, options_.tls.has_value(), "ReaderOptions::tls");
    if (mismatch.ok()) continue;
    absl::MutexLock lock(&mu_);
    if (fatal_.ok()) fatal_ = std::move(mismatch);
    NotifyAllLocked();
    return;
  }
}

void ReaderImpl::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
  }
  // The input wait not yet reported.
  {
    TrainerMessage beat;
    bool has_wait;
    {
      absl::MutexLock lock(&mu_);
      has_wait =
          input_wait_.Take(beat.mutable_heartbeat()->mutable_input_wait());
    }
    if (has_wait) Send(beat);
  }
  // No new grants (a Release frees a credit the coordinator would refill),
  // and a Synced means every grant already sent has arrived: all of them are
  // released below instead of lingering until their TTL.
  {
    TrainerMessage stop;
    stop.mutable_want()->set_credits(0);
    if (Send(stop)) {
      const uint64_t id = SendSync();
      absl::MutexLock lock(&mu_);
      const absl::Time until = absl::Now() + absl::Seconds(2);
      while (id != 0 && ledger_.synced() < id && stream_open_ &&
             absl::Now() < until) {
        cv_.WaitWithDeadline(&mu_, until);
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, u] : units_) {
      if (u->final_report.has_value() || u->dropped) continue;
      TrainerMessage m;
      m.mutable_release()->set_lease_id(u->lease.lease_id());
      m.mutable_release()->set_fence(u->lease.fence());
      m.mutable_release()->set_consumed(u->delivered);
      u->final_report = m;
    }
  }
  FlushReports(false);
  std::vector<std::shared_ptr<Unit>> all;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    for (auto& [id, u] : units_) {
      CancelFetchLocked(*u);
      all.push_back(u);
    }
    for (auto& u : retired_) {
      CancelFetchLocked(*u);
      all.push_back(u);
    }
    NotifyAllLocked();
  }
  // Half-close and let the coordinator end the stream, so the reports just
  // sent arrive (cancelling at once could drop them); cancel after a bound.
  {
    absl::MutexLock lock(&write_mu_);
    if (stream_ != nullptr) {
      WaitTag done;
      stream_->WritesDone(TagOf(&done));
      done.Wait();
    }
  }
  {
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + absl::Seconds(2);
    while (stream_open_ && absl::Now() < until)
      cv_.WaitWithDeadline(&mu_, until);
  }
  {
    absl::MutexLock lock(&write_mu_);
    if (session_ctx_ != nullptr) session_ctx_->TryCancel();
  }
  if (session_thread_.joinable()) session_thread_.join();
  if (maintenance_thread_.joinable()) maintenance_thread_.join();
  // Every stream's last operation completes before the queue shuts down.
  {
    absl::MutexLock lock(&mu_);
    auto outstanding = [&all] {
      for (const auto& u : all) {
        if (u->fetch_started && !u->call_done) return true;
      }
      return false;
    };
    while (outstanding()) cv_.Wait(&mu_);
    // Streams and their contexts go before the queue they completed on.
    entries_.clear();
    units_.clear();
    retired_.clear();
  }
  all.clear();
  cq_.Shutdown();
  if (io_thread_.joinable()) io_thread_.join();
}

absl::StatusOr<v1::Cursor> ReaderImpl::Cursor() {
  if (position_epoch_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job, " rank ", options_.rank,
                     ": no cursor before the first EpochBegin event"));
  }
  client_internal::ReaderPosition position;
  position.job = options_.job;
  position.epoch = position_epoch_;
  position.rank = options_.rank;
  position.worker = options_.worker;
  position.num_workers = options_.num_workers;
  position.consumed = position_consumed_;
  {
    absl::MutexLock lock(&mu_);
    position.world_size = world_size_;
    position.source_names = source_names_;
  }
  const v1::Cursor cursor = client_internal::PositionCursor(position);
  // Report everything delivered, then wait until it is durable. A broken
  // stream loses the Sync: send it again after each reconnect.
  const absl::Time deadline = absl::Now() + options_.reconnect_timeout;
  while (true) {
    FlushReports(true);
    const uint64_t id = SendSync();
    const bool sent = id != 0;
    absl::MutexLock lock(&mu_);
    const absl::Time retry = std::min(deadline, absl::Now() + absl::Seconds(1));
    while (sent && ledger_.synced() < id && fatal_.ok() && !closing_ &&
           absl::Now() < retry) {
      cv_.WaitWithDeadline(&mu_, retry);
    }
    // JobDone follows the last epoch's reports made durable.
    if ((sent && ledger_.synced() >= id) || job_done_) return cursor;
    if (!fatal_.ok()) return fatal_;
    if (closing_) return absl::CancelledError("reader closed");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("coordinator ", options_.coordinator,
                       " did not confirm the reports of job ", options_.job,
                       " rank ", options_.rank, " within ",
                       absl::FormatDuration(options_.reconnect_timeout),
                       "; the cursor is not safe to save"));
    }
    if (!sent) cv_.WaitWithDeadline(&mu_, retry);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Reader>> Reader::Create(ReaderOptions options) {
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError("ReaderOptions.coordinator is empty");
  }
  if (options.job.empty())
    return absl::InvalidArgumentError("ReaderOptions.job is empty");
  if (options.rank < 0)
    return absl::InvalidArgumentError("ReaderOptions.rank is negative");
  if (options.num_workers < 0 || options.worker < 0 ||
      options.worker >= std::max(options.num_workers, 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReaderOptions.worker=", options.worker,
                     " must be in [0, num_workers=", options.num_workers, ")"));
  }
  if (absl::Status tls =
          client_internal::CheckClientTls(options.tls, "ReaderOptions.tls");
      !tls.ok()) {
    return tls;
  }
  auto reader = std::make_unique<ReaderImpl>(std::move(options));
  reader->Start();
  return std::unique_ptr<Reader>(std::move(reader));
}

}  // namespace sluice
