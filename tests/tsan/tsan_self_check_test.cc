// The ThreadSanitizer build checks itself: a counter guarded by an
// absl::Mutex is quiet (Abseil is instrumented, so TSan sees the lock), and
// an unguarded one is reported even with tests/tsan/suppressions.txt in
// force. Without the first, every guarded member of Sluice would be
// reported; without the second, a quiet run would prove nothing.
#include <gtest/gtest.h>

#include <thread>

#include "absl/base/config.h"
#include "absl/synchronization/mutex.h"

#ifndef ABSL_HAVE_THREAD_SANITIZER
#error "tsan_tests is built by the tsan preset only (make test-tsan)"
#endif

namespace sluice {
namespace {

constexpr int kIncrements = 10000;

TEST(TsanSelfCheckTest, ACounterUnderAnAbslMutexIsNotARace) {
  absl::Mutex mu;
  int counter = 0;
  auto add = [&] {
    for (int i = 0; i < kIncrements; ++i) {
      absl::MutexLock lock(&mu);
      ++counter;
    }
  };
  std::thread other(add);
  add();
  other.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(counter, 2 * kIncrements);
}

// Written by two threads with nothing between them (volatile keeps the
// compiler from folding the loop away).
void RaceOnACounter() {
  volatile int counter = 0;
  auto add = [&] {
    for (int i = 0; i < kIncrements; ++i) counter = counter + 1;
  };
  std::thread other(add);
  add();
  other.join();
}

TEST(TsanSelfCheckTest, AnUnguardedCounterIsReported) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  // make test-tsan runs with halt_on_error=1: the first report ends the
  // process with TSan's exit code, 66.
  EXPECT_EXIT(RaceOnACounter(), ::testing::ExitedWithCode(66),
              "ThreadSanitizer: data race");
}

}  // namespace
}  // namespace sluice
