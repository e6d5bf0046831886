// A unit the C++ Reader holds under a lease: the lease, what the consumer
// has taken and reported, the samples buffered for it, and the state of its
// ReadSamples stream (unit_fetcher.h drives the stream; reader.cc hands the
// samples out and reports them).
#ifndef SLUICE_CLIENT_CPP_HELD_UNIT_H_
#define SLUICE_CLIENT_CPP_HELD_UNIT_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "client/cpp/completion_loop.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.pb.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice::client_internal {

struct HeldUnit;

// A step of a unit's ReadSamples stream.
enum class FetchOp { kStart, kRead, kFinish, kRetryAfter };

// Where a completed step goes (the UnitFetcher).
class FetchEvents {
 public:
  virtual ~FetchEvents() = default;
  // On the completion loop's thread.
  virtual void OnFetchEvent(HeldUnit& unit, FetchOp op, bool ok) = 0;
};

// A step's completion-queue tag.
class FetchTag final : public Tag {
 public:
  FetchTag(FetchEvents* events, HeldUnit* unit, FetchOp op)
      : events_(events), unit_(unit), op_(op) {}
  void Done(bool ok) override { events_->OnFetchEvent(*unit_, op_, ok); }

 private:
  FetchEvents* events_;
  HeldUnit* unit_;
  FetchOp op_;
};

struct HeldUnit {
  explicit HeldUnit(FetchEvents* events)
      : start_tag(events, this, FetchOp::kStart),
        read_tag(events, this, FetchOp::kRead),
        finish_tag(events, this, FetchOp::kFinish),
        retry_tag(events, this, FetchOp::kRetryAfter) {}
  HeldUnit(const HeldUnit&) = delete;
  HeldUnit& operator=(const HeldUnit&) = delete;

  v1::Lease lease;
  int64_t order = 0;  // grant order: reports go out in this order
  int64_t size = 0;
  std::deque<Sample> buffer;
  int64_t next_fetch = 0;          // absolute sample index
  int64_t last_batch_samples = 0;  // size of the newest batch received
  enum class Fetch { kRunning, kDone, kFailed } fetch = Fetch::kRunning;
  std::string fetch_error;
  // The stream ended because its data server drains (sluice.v1.HandedBack):
  // the rest is given back with a Release, not re-routed as a failure.
  bool handed_back = false;
  bool dropped = false;
  int64_t delivered = 0;
  int64_t reported = 0;
  std::optional<v1::TrainerMessage> final_report;  // Complete / Reroute /
                                                   // Release
  absl::Time last_activity;  // last message from the data server
  bool stalled = false;
  // The unit's ReadSamples stream, a small state machine driven by the I/O
  // thread (UnitFetcher::OnFetchEvent); at most one operation outstanding.
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
  // before re-routing; fails with retry_error.
  std::unique_ptr<grpc::Alarm> retry_alarm;
  std::string retry_error;
  // The alarm reopens the stream on the same server instead (it refused
  // it for now: RESOURCE_EXHAUSTED); how often it has so far.
  bool retry_here = false;
  int busy_retries = 0;
  // Keeps the unit alive while an operation is outstanding.
  std::shared_ptr<HeldUnit> io_hold;
  FetchTag start_tag, read_tag, finish_tag, retry_tag;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_HELD_UNIT_H_
