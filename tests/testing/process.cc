#include "tests/testing/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace sluice::testing {

std::string BinDir() { return SLUICE_BIN_DIR; }

std::map<std::string, std::string> ParseKeyValueFile(const std::string& text) {
  std::map<std::string, std::string> result;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv =
        absl::StrSplit(line, absl::MaxSplits('=', 1));
    result[kv.first] = kv.second;
  }
  return result;
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::StatusOr<ChildProcess> ChildProcess::Start(
    const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int log_fd = -1;
  if (!log_path.empty()) {
    log_fd =
        open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) return absl::InternalError("cannot open log " + log_path);
  }
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    // The test process may block signals (servers' own code does); children
    // start with a clean mask.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  ChildProcess child;
  child.pid_ = pid;
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_), exit_code_(other.exit_code_) {
  other.pid_ = -1;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    Kill();
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    other.pid_ = -1;
  }
  return *this;
}

ChildProcess::~ChildProcess() { Kill(); }

bool ChildProcess::running() {
  if (pid_ < 0 || exit_code_.has_value()) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exit_code_ =
        WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

void ChildProcess::Signal(int signo) {
  if (running()) kill(pid_, signo);
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ",
                       absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));  // polling waitpid, not a sync sleep
  }
  if (!exit_code_.has_value())
    return absl::FailedPreconditionError("not started");
  return *exit_code_;
}

void ChildProcess::Kill() {
  if (running()) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    exit_code_ = 128 + SIGKILL;
  }
}

absl::StatusOr<ServerProcess> ServerProcess::Start(
    const std::string& binary, const std::string& dir,
    const std::vector<std::string>& extra_args, absl::Duration timeout) {
  static int counter = 0;
  const std::string tag = absl::StrCat(binary, "-", counter++);
  const std::string port_file = absl::StrCat(dir, "/", tag, ".ports");
  ServerProcess server;
  server.log_path = absl::StrCat(dir, "/", tag, ".log");
  std::vector<std::string> argv = {
      BinDir() + "/" + binary, "--listen=127.0.0.1:0",
      "--metrics_listen=127.0.0.1:0", "--port_file=" + port_file};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  // A coordinator keeps its journal inside the test's directory unless the
  // test names one (e.g. to restart on the same journal).
  if (binary == "sluice-coordinator" &&
      std::none_of(extra_args.begin(), extra_args.end(),
                   [](const std::string& a) {
                     return a.rfind("--journal_dir=", 0) == 0;
                   })) {
    argv.push_back(absl::StrCat("--journal_dir=", dir, "/", tag, ".journal"));
  }
  // A data server needs --roots; default to the test's directory.
  if (binary == "sluice-dataserver" &&
      std::none_of(
          extra_args.begin(), extra_args.end(),
          [](const std::string& a) { return a.rfind("--roots=", 0) == 0; })) {
    argv.push_back(absl::StrCat("--roots=", dir));
  }
  auto child = ChildProcess::Start(argv, server.log_path);
  if (!child.ok()) return child.status();
  server.process = std::move(*child);
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (auto text = ReadWholeFile(port_file)) {
      auto kv = ParseKeyValueFile(*text);
      server.grpc_address = kv["grpc"];
      server.metrics_address = kv["metrics"];
      return server;
    }
    if (!server.process.running()) {
      return absl::UnavailableError(
          absl::StrCat(binary, " exited before listening; log:\n",
                       ReadWholeFile(server.log_path).value_or("")));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(binary +
                                         " wrote no port file in time");
    }
    absl::SleepFor(absl::Milliseconds(5));  // polling the port file
  }
}

}  // namespace sluice::testing
