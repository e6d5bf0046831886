// Reading a SampleStream in a test: its next answer, waited for.
#ifndef SLUICE_TESTS_UNIT_DATASERVER_STREAM_READING_H_
#define SLUICE_TESTS_UNIT_DATASERVER_STREAM_READING_H_

#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/dataserver/sample_stream.h"

namespace sluice::dataserver {

// The stream's next answer: a message, nullopt at its end, or its error
// (DEADLINE_EXCEEDED if none comes within 20 s: a stalled stream is
// reported, not waited on forever).
inline absl::StatusOr<std::optional<EncodedMessage>> NextOf(
    SampleStream& stream) {
  absl::Notification done;
  absl::StatusOr<std::optional<EncodedMessage>> next;
  stream.Next([&](absl::StatusOr<std::optional<EncodedMessage>> v) {
    next = std::move(v);
    done.Notify();
  });
  if (!done.WaitForNotificationWithTimeout(absl::Seconds(20))) {
    // The callback may still run later and write `next`: wait for it, so it
    // never writes to a dead frame, but report the stall.
    done.WaitForNotification();
    return absl::DeadlineExceededError("the stream stalled for 20 s");
  }
  return next;
}

}  // namespace sluice::dataserver

#endif  // SLUICE_TESTS_UNIT_DATASERVER_STREAM_READING_H_
