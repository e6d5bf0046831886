// The writing side of a gRPC callback (reactor) stream: a queue with one
// write in flight, and Finish only after the queue has drained.
//
// A client that stops reading while the server keeps sending would grow
// the queue without bound: past `max_messages` or `max_bytes` queued, the
// queue is dropped and the stream ends with RESOURCE_EXHAUSTED naming the
// limits (the service then treats it as any broken stream). A write that
// fails (the peer is gone) drops what is queued; Finish still runs once.
// The writer outlives its reactor: after Detach (from OnDone) everything is
// dropped.
//
// `Reactor` is anything with StartWrite(const Message*) and
// Finish(grpc::Status) — a grpc::ServerBidiReactor, or a fake in tests.
// The reactor calls OnWriteDone(ok) from its own OnWriteDone. Thread-safe.
#ifndef SLUICE_SERVER_COMMON_GRPC_STREAM_WRITER_H_
#define SLUICE_SERVER_COMMON_GRPC_STREAM_WRITER_H_

#include <grpcpp/support/status.h>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace sluice {

// Messages (and their bytes) a stream may have waiting for its client to
// read them: beyond either, a client that does not read is ended.
inline constexpr size_t kMaxQueuedMessages = 65536;
inline constexpr size_t kMaxQueuedBytes = 64 << 20;

template <typename Reactor, typename Message>
class StreamWriter {
 public:
  explicit StreamWriter(Reactor* reactor,
                        size_t max_messages = kMaxQueuedMessages,
                        size_t max_bytes = kMaxQueuedBytes)
      : reactor_(reactor), max_messages_(max_messages), max_bytes_(max_bytes) {}

  // Queues `m`; dropped once Finish was asked for or after Detach.
  void Send(Message m) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finish_requested_) return;
    queued_bytes_ += m.ByteSizeLong();
    queue_.push_back(std::move(m));
    if (queue_.size() > max_messages_ || queued_bytes_ > max_bytes_) {
      const std::string why = absl::StrCat(
          "the client has not read ", queue_.size(), " messages (",
          queued_bytes_,
          " bytes) of this stream; ending it (limits: ", max_messages_,
          " messages, ", max_bytes_, " bytes)");
      queue_.clear();
      queued_bytes_ = 0;
      finish_requested_ = true;
      finish_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, why);
    }
    MaybeWriteLocked();
  }

  // Ends the stream with `status` once everything queued is written. Only
  // the first call counts.
  void Finish(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = status;
    MaybeWriteLocked();
  }

  void OnWriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {  // the peer is gone; Finish still runs once
      queue_.clear();
      queued_bytes_ = 0;
    }
    MaybeWriteLocked();
  }

  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

  // Whether Finish was asked for (or the limits ended the stream).
  bool finishing() {
    absl::MutexLock lock(&mu_);
    return finish_requested_;
  }

 private:
  void MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= std::min(queued_bytes_, current_.ByteSizeLong());
      writing_ = true;
      reactor_->StartWrite(&current_);
    } else if (finish_requested_) {
      finished_ = true;
      reactor_->Finish(finish_status_);
    }
  }

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_);
  const size_t max_messages_;
  const size_t max_bytes_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Message current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_GRPC_STREAM_WRITER_H_
