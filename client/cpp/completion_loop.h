// The C++ Reader's one I/O thread: every asynchronous gRPC operation of a
// Reader completes on one completion queue, drained by one thread that calls
// the operation's tag. A single thread waiting in gRPC matters: with several
// (a sync stream per thread), gRPC hands the poller role between them and
// each received message costs thread wake-ups on the way to its reader.
#ifndef SLUICE_CLIENT_CPP_COMPLETION_LOOP_H_
#define SLUICE_CLIENT_CPP_COMPLETION_LOOP_H_

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/base/config.h"
#include "absl/synchronization/notification.h"

#ifdef ABSL_HAVE_THREAD_SANITIZER
#include <sanitizer/tsan_interface.h>
#endif

namespace sluice::client_internal {

// What an operation calls when it completes (on the loop's thread).
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Done(bool ok) = 0;
};

// For blocking calls from another thread: start the operation with this
// tag, then Wait() for the loop to complete it.
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

// The void* gRPC carries for a tag, always through Tag* so the loop's cast
// back is exact. Every tag reaches gRPC through here and comes back through
// CompletionLoop::Complete, so under ThreadSanitizer these two mark the
// completion queue's hand-off, which happens inside gRPC's uninstrumented
// libraries: what the starting thread wrote before handing the tag over
// happens before the tag's Done on the loop's thread.
inline void* TagOf(Tag* tag) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_release(tag);
#endif
  return tag;
}

class CompletionLoop {
 public:
  CompletionLoop() = default;
  CompletionLoop(const CompletionLoop&) = delete;
  CompletionLoop& operator=(const CompletionLoop&) = delete;
  ~CompletionLoop() { Shutdown(); }

  void Start();
  grpc::CompletionQueue* cq() { return &cq_; }
  // Call once every operation started on cq() has completed: shuts the
  // queue down and joins the thread. Idempotent.
  void Shutdown();

 private:
  // Hands a completed tag to its Done (on the loop's thread).
  static void Complete(void* tag, bool ok);

  grpc::CompletionQueue cq_;
  std::thread thread_;
  bool shut_down_ = false;
};

}  // namespace sluice::client_internal

#endif  // SLUICE_CLIENT_CPP_COMPLETION_LOOP_H_
