// The C++ Reader's Session stream to the coordinator, as a transport: one
// thread connects (polling the channel, its back-off capped by the handler's
// lease TTL), opens the stream, writes the handler's Hello and Want before
// any other writer may write, hands every message read to the handler, and
// after the stream ends reconnects after a back-off, until the handler no
// longer wants a session or the coordinator stays unreachable for the
// reconnect timeout (measured on the clock given; the pauses between
// attempts pass in real time). A client and coordinator that
// disagree about TLS fail at once instead, and so does a status reconnecting
// cannot help (NOT_FOUND, INVALID_ARGUMENT, FAILED_PRECONDITION, ...).
//
// Writes are blocking, one at a time, from any thread; a write while no
// stream is open fails. What the messages mean (grants, reports, Syncs) is
// the handler's: the Reader (reader_impl.h).
#ifndef SLUICE_CLIENT_CPP_COORDINATOR_SESSION_H_
#define SLUICE_CLIENT_CPP_COORDINATOR_SESSION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <thread>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/cpp/completion_loop.h"
#include "server/common/clock.h"
#include "sluice/reader.h"
#include "sluice/v1/coordinator.grpc.pb.h"

namespace sluice::client_internal {

// What the session asks of, and tells, the reader it serves. Called on the
// session's thread with none of the session's locks held, except
// OpeningMessages (under the write lock: nothing else is written first).
class SessionHandler {
 public:
  virtual ~SessionHandler() = default;
  // Whether a session is still wanted (false: the reader closes, or its
  // job is done); checked before each connection attempt.
  virtual bool SessionWanted() = 0;
  // The lease TTL the reconnect back-off stays well within.
  virtual absl::Duration LeaseTtl() = 0;
  // The Hello and the Want a new stream starts with.
  virtual void OpeningMessages(v1::TrainerMessage* hello,
                               v1::TrainerMessage* want) = 0;
  // A stream opened (`true`) or ended (`false`).
  virtual void StreamOpen(bool open) = 0;
  // The stream's first Welcome, and every other message, in order.
  virtual void Welcomed(const v1::CoordinatorMessage& welcome) = 0;
  virtual void Received(const v1::CoordinatorMessage& message) = 0;
  // The session ends for good: `status` says why.
  virtual void Failed(absl::Status status) = 0;
};

class CoordinatorSession {
 public:
  // `loop`, `clock` and `handler` outlive the session.
  CoordinatorSession(const ReaderOptions& options, CompletionLoop* loop,
                     const Clock* clock, SessionHandler* handler);
  ~CoordinatorSession() { Stop(); }
  CoordinatorSession(const CoordinatorSession&) = delete;
  CoordinatorSession& operator=(const CoordinatorSession&) = delete;

  // Starts the session's thread.
  void Start();
  // Writes the message `build` fills in, under the write lock (so messages
  // built in order are written in order). False when no stream is open or
  // the write failed (the stream broke).
  bool Send(absl::FunctionRef<void(v1::TrainerMessage*)> build);
  bool Send(const v1::TrainerMessage& message) {
    return Send([&message](v1::TrainerMessage* out) { *out = message; });
  }
  // Half-closes the open stream (the coordinator then ends it).
  void WritesDone();
  // Cancels the open stream, ends the back-off wait and joins the thread.
  // The handler must no longer want a session. Idempotent.
  void Stop();
  // Streams that broke after a Welcome and were opened again.
  int64_t reconnects() const {
    absl::MutexLock lock(&mu_);
    return reconnects_;
  }

 private:
  void Run();

  const ReaderOptions& options_;
  CompletionLoop* const loop_;
  const Clock* const clock_;
  SessionHandler* const handler_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex write_mu_;
  grpc::ClientAsyncReaderWriter<v1::TrainerMessage, v1::CoordinatorMessage>*
      stream_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(write_mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(write_mu_) = false;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_COORDINATOR_SESSION_H_
