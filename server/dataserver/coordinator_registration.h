// Keeps a data server registered with the coordinator: opens the
// RegisterDataServer stream, sends Register{address, capacity}, then a
// heartbeat at the interval the coordinator asks for. When the stream breaks
// (coordinator restarted, network) it reconnects with jittered exponential
// backoff (100 ms .. 1 s) and registers again. When the coordinator stops
// answering heartbeats for its data-server timeout while the stream stays up
// (a stopped process, a frozen VM), it registers again on a new channel, so
// a standby that has taken over is found. Prefetch hints the
// coordinator sends on the stream go to `on_prefetch` (on the reading
// thread). Thread-safe; Stop() joins.
#ifndef SLUICE_SERVER_DATASERVER_COORDINATOR_REGISTRATION_H_
#define SLUICE_SERVER_DATASERVER_COORDINATOR_REGISTRATION_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "sluice/v1/coordinator.pb.h"

namespace sluice::dataserver {

class CoordinatorRegistration {
 public:
  struct Options {
    std::string coordinator;  // "host:port"
    std::string advertise;    // address trainers use for this server
    int32_t capacity = 1;
    std::string node;  // RegisterDataServer.node
    std::string pool;  // RegisterDataServer.pool ("" = the default pool)
    std::shared_ptr<grpc::ChannelCredentials> credentials;  // null = insecure
    std::function<int()> active_streams;                    // for heartbeats
    std::function<uint64_t()> max_fence_seen;               // may be empty
    std::function<int64_t()> samples_served;                // may be empty
    int32_t cores = 1;  // that the server decodes on (heartbeat load)
    std::function<void(const v1::PrefetchHint&)> on_prefetch;  // may be empty
    // RegisterDataServer.credential (SignRegistration of `advertise`);
    // empty when no lease secret is set.
    std::string credential;
  };

  explicit CoordinatorRegistration(Options options);
  ~CoordinatorRegistration();

  void Start();
  // Tells the coordinator this server is leaving (DataServerDraining, on
  // this stream and on any registration after it): nothing new is routed
  // here. Heartbeats go on until Stop(), which deregisters.
  void Drain();
  void Stop();
  // Registrations acknowledged by a coordinator so far (tests, logs).
  int registrations() const;

 private:
  void Run();
  // Waits `d` or until Stop(), Drain() or the stream breaks; false when
  // stopping.
  bool Sleep(absl::Duration d);

  const Options options_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stream_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_sent_ ABSL_GUARDED_BY(mu_) = false;  // on the current stream
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_COORDINATOR_REGISTRATION_H_
