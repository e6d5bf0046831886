// The C++ Reader's fetching: one ReadSamples stream per held unit, a state
// machine driven by the completion loop. Start: StartCall, then Read after
// Read while the unit's buffer has room (the consumer resumes the Read it
// skipped once room appears: ResumeReadLocked), then Finish once a Read
// fails (end of stream or cancelled); Finish's status decides the unit's
// fate: done, failed (re-routed by the reader's report), handed back (its
// server drains), retried on the same server (RESOURCE_EXHAUSTED), retried
// after a back-off (reroute_backoff.h), or fatal to the reader (corrupt
// data, a configuration that does not match the shards). Streams open in
// grant order as the turn rule allows (fetch_turn.h). A stream silent for
// the stall timeout is cancelled (CancelStalledLocked, by the clock given).
//
// It owns the data servers' channels, the re-route back-off and the
// transport checks; the units it fetches are the reader's (HeldUnit), read
// and changed under the reader's mutex, which the fetcher takes on the
// completion loop's thread. Every *Locked method runs with it held.
#ifndef SLUICE_CLIENT_CPP_UNIT_FETCHER_H_
#define SLUICE_CLIENT_CPP_UNIT_FETCHER_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/completion_loop.h"
#include "client/cpp/fetch_turn.h"
#include "client/cpp/held_unit.h"
#include "client/cpp/reroute_backoff.h"
#include "server/common/clock.h"
#include "sluice/reader.h"
#include "sluice/v1/dataserver.grpc.pb.h"

namespace sluice::client_internal {

// What the fetcher tells the reader it serves, with the reader's mutex held.
class FetchListener {
 public:
  virtual ~FetchListener() = default;
  // Samples arrived in a unit's buffer, or its stream broke the protocol:
  // wake the consumer.
  virtual void SamplesArrivedLocked() = 0;
  // A unit's stream ended (done, failed, handed back, retrying): wake
  // everyone and open the streams whose turn has come.
  virtual void FetchEndedLocked() = 0;
  // An answer no re-route can help (corrupt data under on_corrupt=fail, a
  // manifest that does not match the shards): the reader fails with it.
  virtual void FailLocked(absl::Status status) = 0;
  // A data server failed UNAVAILABLE: TakeTransportChecksLocked has its
  // address, to be asked (outside the lock) whether it speaks TLS.
  virtual void TransportCheckQueuedLocked() = 0;
};

using HeldUnits = std::map<std::string, std::shared_ptr<HeldUnit>>;

class UnitFetcher final : public FetchEvents {
 public:
  // `units` (the reader's, by lease id), `mu` (guarding them and this),
  // `loop`, `clock` and `listener` outlive the fetcher.
  UnitFetcher(const ReaderOptions& options, absl::Mutex* mu,
              const HeldUnits* units, CompletionLoop* loop, const Clock* clock,
              FetchListener* listener);

  // Opens, in grant order, the streams of the units whose turn has come.
  void StartEligibleLocked();
  // Issues the Read a unit skipped on a full buffer, once the consumer has
  // made room.
  void ResumeReadLocked(HeldUnit& u);
  // Stops a unit's stream: its outstanding operation fails, then Finish.
  void CancelLocked(HeldUnit& u);
  // Gives back (fails as handed back, unopened) the units held on the
  // draining data server at `address`: those waiting for their turn, and
  // those waiting to open their stream there again after it was busy. The
  // streams open there are given back too if they break (UNAVAILABLE) or
  // go quiet, until a stream opens there again.
  void HandBackUnopenedLocked(const std::string& address,
                              const std::string& why);
  // Cancels the streams silent for longer than the stall timeout at `now`;
  // each then fails as stalled, and the units on its server with it.
  void CancelStalledLocked(absl::Time now);
  // The data servers to ask whether they speak TLS (each once).
  std::vector<std::string> TakeTransportChecksLocked();
  bool transport_checks_queued() const { return !transport_checks_.empty(); }
  // The reader is closing: outcomes no longer matter (`closed`), or every
  // stream is being cancelled and none may open (`closing`).
  void SetClosedLocked() { closed_ = true; }
  void SetClosingLocked() { closing_ = true; }
  int64_t batches() const { return batches_; }

  void OnFetchEvent(HeldUnit& u, FetchOp op, bool ok) override;

 private:
  void StartLocked(const std::shared_ptr<HeldUnit>& u);
  void OnBatch(HeldUnit& u, bool ok);
  void OnFinished(HeldUnit& u);
  void IssueReadLocked(HeldUnit& u);
  void BeginFinishLocked(HeldUnit& u);
  // Sets a running unit's fetch outcome (the first one stands).
  void EndFetchLocked(HeldUnit& u, HeldUnit::Fetch state,
                      const std::string& error);
  // Fails every other unit held on `failed`'s data server.
  void FailSiblingsLocked(const HeldUnit& failed, const std::string& error);
  // Arms `u`'s retry alarm to fire after `wait`.
  void ArmRetryLocked(HeldUnit& u, absl::Duration wait);
  // The turn rule (fetch_turn.h) over the units held.
  bool MayStartLocked(const HeldUnit& u);

  const ReaderOptions& options_;
  absl::Mutex* const mu_;
  const HeldUnits* const units_;
  CompletionLoop* const loop_;
  const Clock* const clock_;
  FetchListener* const listener_;
  const std::shared_ptr<grpc::ChannelCredentials> creds_;

  bool closed_ = false;
  bool closing_ = false;
  int64_t batches_ = 0;
  std::map<std::string, std::shared_ptr<v1::DataServer::Stub>> stubs_;
  // Streams that failed in a row, per (data server, unit key).
  RerouteBackoff reroute_backoff_;
  std::set<std::string> transport_checked_;
  // Data servers draining (HandBackUnopenedLocked) that no stream has
  // opened on since.
  std::set<std::string> leaving_;
  std::vector<std::string> transport_checks_;
  std::vector<FetchTurnView> turn_views_;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_UNIT_FETCHER_H_
