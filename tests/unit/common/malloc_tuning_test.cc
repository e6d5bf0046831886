#include "server/common/malloc_tuning.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/process.h"

namespace sluice {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLUICE_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SLUICE_SANITIZED_ALLOCATOR 1
#endif
#endif

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The streaming pattern, on a thread other than main (its own malloc arena,
// as gRPC's and the Reader's threads): four ~1 MiB buffers filled, then
// freed, 100 times after a warm-up round. Runs in a child process so that
// each measurement starts from a fresh allocator; returns the page faults
// per round.
double FaultsPerRound(bool tune) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (tune && !TuneMallocForStreaming()) _exit(3);
    double per_round = 0;
    std::thread worker([&per_round] {
      constexpr int kRounds = 100;
      for (int pass = 0; pass < 2; ++pass) {
        long before = MinorFaults();
        for (int round = 0; round < kRounds; ++round) {
          std::vector<char*> buffers;
          for (size_t i = 0; i < 4; ++i) {
            const size_t size = (size_t{1} << 20) + i * 4096;
            char* p = static_cast<char*>(std::malloc(size));
            std::memset(p, 1, size);
            buffers.push_back(p);
          }
          for (char* p : buffers) std::free(p);
        }
        per_round = static_cast<double>(MinorFaults() - before) / kRounds;
      }
    });
    worker.join();
    ssize_t n = write(fds[1], &per_round, sizeof(per_round));
    _exit(n == sizeof(per_round) ? 0 : 4);
  }
  close(fds[1]);
  double per_round = -1;
  ssize_t n = read(fds[0], &per_round, sizeof(per_round));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n != sizeof(per_round) || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return -1;
  return per_round;
}

TEST(MallocTuningTest, MegabyteBuffersStopFaultingPagesInAgain) {
#if defined(SLUICE_SANITIZED_ALLOCATOR) || !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's allocator is not the one in use";
#else
  const double untuned = FaultsPerRound(false);
  const double tuned = FaultsPerRound(true);
  ASSERT_GE(untuned, 0);
  ASSERT_GE(tuned, 0) << "TuneMallocForStreaming() refused the settings";
  // With glibc's defaults every round gives the pages back and faults them
  // in again (~1,000 faults for 4 MiB); this is what the tuning is for.
  EXPECT_GE(untuned, 500) << "glibc's defaults no longer reproduce the problem";
  EXPECT_LE(tuned, 2) << "untuned: " << untuned << " faults per round";
#endif
}

TEST(MallocTuningTest, CanBeAppliedAgain) {
#if defined(SLUICE_SANITIZED_ALLOCATOR) || !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's allocator is not the one in use";
#else
  pid_t pid = fork();
  if (pid == 0)
    _exit(TuneMallocForStreaming() && TuneMallocForStreaming() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

TEST(MallocTuningTest, NamesTheLibraryWhoseMallocIsInUse) {
#if defined(SLUICE_SANITIZED_ALLOCATOR) || !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's allocator is not the one in use";
#else
  // This test binary does not link jemalloc (only the coordinator does).
  EXPECT_EQ(MallocProvider(), "libc.so.6");
#endif
}

TEST(MallocTuningTest, IsNotAppliedToAnotherMalloc) {
#if defined(SLUICE_SANITIZED_ALLOCATOR) || !defined(__GLIBC__)
  GTEST_SKIP() << "glibc's allocator is not the one in use";
#else
  // glibc's mallopt would accept the settings even with jemalloc in use;
  // they would change nothing. A child with jemalloc preloaded sees it
  // named and the tuning declined.
  const char* jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";
  if (access(jemalloc, R_OK) != 0) GTEST_SKIP() << jemalloc << " not installed";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    // The probe binary (tests/testing/malloc_probe.cc) with the preload.
    setenv("LD_PRELOAD", jemalloc, 1);
    const std::string probe = testing::BinDir() + "/malloc_probe";
    execl(probe.c_str(), "malloc_probe", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0)
    out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("provider=libjemalloc.so.2 tuned=0"), std::string::npos)
      << out;
#endif
}

}  // namespace
}  // namespace sluice
