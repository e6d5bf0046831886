#include "client/cli/subprocess.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace sluice::cli {

absl::StatusOr<Subprocess> Subprocess::Spawn(
    const std::vector<std::string>& argv, const std::string& stdout_path,
    const std::string& stderr_path, bool die_with_parent,
    const std::vector<std::string>& unset_env) {
  if (argv.empty()) return absl::InvalidArgumentError("no command to run");
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment, less `unset_env` ("NAME=value" entries).
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const absl::string_view entry(*e);
    const absl::string_view name = entry.substr(0, entry.find('='));
    if (std::find(unset_env.begin(), unset_env.end(), name) == unset_env.end())
      env.push_back(*e);
  }
  env.push_back(nullptr);
  auto open_out = [](const std::string& path) {
    return path.empty() ? -1
                        : open(path.c_str(),
                               O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  };
  int out = open_out(stdout_path), err = open_out(stderr_path);
  if ((!stdout_path.empty() && out < 0) || (!stderr_path.empty() && err < 0)) {
    return absl::InternalError(
        absl::StrCat("cannot open ", stdout_path, " / ", stderr_path));
  }
  pid_t pid = -1;
  if (!die_with_parent) {
    // posix_spawn: no copy of this process's page tables, and none of its
    // fork handlers run (gRPC's would stop and restart its threads; a
    // Python parent's are for forks that go on running Python).
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (out >= 0)
      posix_spawn_file_actions_adddup2(&actions, out, STDOUT_FILENO);
    if (err >= 0)
      posix_spawn_file_actions_adddup2(&actions, err, STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    const int failed =
        posix_spawnp(&pid, args[0], &actions, &attr, args.data(), env.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    if (failed != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot run ", argv[0], ": ", std::strerror(failed)));
    }
    Subprocess p;
    p.pid_ = pid;
    return p;
  }
  // Written by the child if exec fails (only async-signal-safe calls there).
  const std::string cannot_run = absl::StrCat("cannot run ", argv[0], "\n");
  pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (out >= 0) dup2(out, STDOUT_FILENO);
    if (err >= 0) dup2(err, STDERR_FILENO);
    execvpe(args[0], args.data(), env.data());
    (void)!write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    _exit(127);
  }
  if (out >= 0) close(out);
  if (err >= 0) close(err);
  Subprocess p;
  p.pid_ = pid;
  return p;
}

Subprocess& Subprocess::operator=(Subprocess&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !exit_code_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = o.pid_;
    exit_code_ = o.exit_code_;
    o.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0 && !exit_code_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Subprocess::Signal(int signo) {
  if (pid_ > 0 && !exit_code_) kill(pid_, signo);
}

std::optional<int> Subprocess::Poll() {
  if (exit_code_ || pid_ <= 0) return exit_code_;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    exit_code_ =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return exit_code_;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no process started");
  if (auto code = Poll()) return *code;
  const absl::Time deadline = absl::Now() + timeout;
  // A pidfd turns readable when the child exits: waitpid has no timeout,
  // poll on it does. The child is not reaped yet, so its PID is still ours.
  // (A raw syscall: glibc 2.36's <sys/pidfd.h> lacks extern "C".)
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  while (true) {
    if (auto code = Poll()) {
      if (pidfd >= 0) close(pidfd);
      return *code;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    if (pidfd < 0) {
      // No pidfds (a kernel before 5.3): look again shortly.
      absl::SleepFor(std::min(left, absl::Milliseconds(10)));
      continue;
    }
    pollfd exited = {pidfd, POLLIN, 0};
    const int ms = left == absl::InfiniteDuration()
                       ? -1
                       : static_cast<int>(std::min<int64_t>(
                             absl::ToInt64Milliseconds(
                                 absl::Ceil(left, absl::Milliseconds(1))),
                             INT_MAX));
    (void)poll(&exited, 1, ms);  // EINTR: the loop looks again
  }
  if (pidfd >= 0) close(pidfd);
  return absl::DeadlineExceededError(
      absl::StrCat("pid ", pid_, " still running"));
}

void Subprocess::Stop(absl::Duration grace) {
  if (!running()) return;
  Signal(SIGTERM);
  if (!Wait(grace).ok()) {
    Signal(SIGKILL);
    (void)Wait(absl::Seconds(10));
  }
}

void Subprocess::Kill() {
  if (!running()) return;
  Signal(SIGKILL);
  (void)Wait(absl::InfiniteDuration());
}

std::string SelfPath() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

std::string SelfDir() {
  std::string self = SelfPath();
  return self.substr(0, self.rfind('/'));
}

absl::StatusOr<std::map<std::string, std::string>> WaitForPortFile(
    const std::string& path, Subprocess& process, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    if (in) {
      std::stringstream s;
      s << in.rdbuf();
      std::map<std::string, std::string> kv;
      for (absl::string_view line :
           absl::StrSplit(s.str(), '\n', absl::SkipEmpty())) {
        std::pair<std::string, std::string> p =
            absl::StrSplit(line, absl::MaxSplits('=', 1));
        kv[p.first] = p.second;
      }
      if (kv.count("grpc")) return kv;
    }
    if (auto code = process.Poll()) {
      return absl::InternalError(absl::StrCat(
          "pid ", process.pid(), " exited with ", *code, " before listening"));
    }
    absl::SleepFor(absl::Milliseconds(20));  // poll for the file
  }
  return absl::DeadlineExceededError("no port file at " + path);
}

absl::Status WaitForReadiness(
    const std::string& address, Subprocess& process, absl::Duration timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (credentials == nullptr) credentials = grpc::InsecureChannelCredentials();
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, credentials));
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("readiness");
    grpc::health::v1::HealthCheckResponse response;
    if (stub->Check(&ctx, request, &response).ok() &&
        response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    if (auto code = process.Poll()) {
      return absl::InternalError(absl::StrCat("pid ", process.pid(),
                                              " exited with ", *code,
                                              " before it was ready"));
    }
    absl::SleepFor(absl::Milliseconds(20));  // poll
  }
  return absl::DeadlineExceededError(absl::StrCat(
      address, " not ready within ", absl::FormatDuration(timeout)));
}

}  // namespace sluice::cli
