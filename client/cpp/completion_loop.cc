#include "client/cpp/completion_loop.h"

namespace sluice::client_internal {

void CompletionLoop::Start() {
  thread_ = std::thread([this] {
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) Complete(tag, ok);
  });
}

void CompletionLoop::Complete(void* tag, bool ok) {
#ifdef ABSL_HAVE_THREAD_SANITIZER
  __tsan_acquire(tag);
#endif
  static_cast<Tag*>(tag)->Done(ok);
}

void CompletionLoop::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  cq_.Shutdown();
  if (thread_.joinable()) {
    thread_.join();
  } else {  // never started: drain it here
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
}

}  // namespace sluice::client_internal
