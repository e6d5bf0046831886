// LiveCalls: how many calls a gRPC server has in progress, counted by a
// server interceptor (one is created with each call and destroyed when the
// call is done), so that a server shutting down can tell when nothing it
// serves is left and close its connections instead of waiting for every
// client to close its own.
//
// gRPC's shutdown waits for each client connection to close after its
// GOAWAY; a client whose channel is idle reads it only when it next polls
// (every 5 s for a channel with no calls), and one that never reads holds
// the server until the drain deadline.
//
// Thread-safe.
#ifndef SLUICE_SERVER_COMMON_LIVE_CALLS_H_
#define SLUICE_SERVER_COMMON_LIVE_CALLS_H_

#include <grpcpp/support/server_interceptor.h>

#include <cstdint>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sluice {

class LiveCalls {
 public:
  LiveCalls() = default;
  LiveCalls(const LiveCalls&) = delete;
  LiveCalls& operator=(const LiveCalls&) = delete;

  // For ServerBuilder::experimental().SetInterceptorCreators: counts every
  // call of the server it is built into.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
  InterceptorFactory();

  void Started();
  void Finished();
  int64_t live() const;

  // Waits until no call is live, Stop() was called, or `deadline`. Returns
  // whether no call is live.
  bool AwaitNoneLive(absl::Time deadline) const;
  // Ends every wait in AwaitNoneLive and AwaitStopped (now and later).
  void Stop();
  bool stopped() const;
  // Waits until Stop() was called or `deadline`; returns whether it was.
  bool AwaitStopped(absl::Time deadline) const;

 private:
  mutable absl::Mutex mu_;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_LIVE_CALLS_H_
