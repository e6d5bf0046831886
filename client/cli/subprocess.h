// Child processes for sluicectl up/demo: spawn with output to a file, signal
// and reap by PID, read a server's --port_file.
#ifndef SLUICE_CLIENT_CLI_SUBPROCESS_H_
#define SLUICE_CLIENT_CLI_SUBPROCESS_H_

#include <grpcpp/security/credentials.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::cli {

class Subprocess {
 public:
  // stdout to `stdout_path`, stderr to `stderr_path` (either may be empty =
  // inherit). Starts with an empty signal mask. argv[0] without a '/' is
  // looked up in PATH. Spawned with posix_spawn: the caller's fork handlers
  // (gRPC's, a Python interpreter's) do not run, and a command that cannot
  // be run is a FAILED_PRECONDITION naming it. With `die_with_parent`, the
  // child is SIGKILLed when the thread that spawned it ends
  // (PR_SET_PDEATHSIG, set between fork and exec): for a command run in the
  // foreground, from the main thread; one that cannot be run then exits
  // 127, saying so on its stderr. The child gets this process's environment
  // without the variables named in `unset_env`.
  static absl::StatusOr<Subprocess> Spawn(
      const std::vector<std::string>& argv, const std::string& stdout_path,
      const std::string& stderr_path, bool die_with_parent = false,
      const std::vector<std::string>& unset_env = {});
  Subprocess() = default;
  Subprocess(Subprocess&& o) noexcept { *this = std::move(o); }
  Subprocess& operator=(Subprocess&& o) noexcept;
  ~Subprocess();  // SIGKILLs and reaps a child still running

  pid_t pid() const { return pid_; }
  void Signal(int signo);
  // Non-blocking: the exit code once the child has exited.
  std::optional<int> Poll();
  // Started and not exited yet.
  bool running() { return pid_ > 0 && !Poll().has_value(); }
  // Exit code (128+signal when killed), DEADLINE_EXCEEDED, or
  // FAILED_PRECONDITION for a handle without a process.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // SIGTERM, then SIGKILL after `grace`; nothing for a handle without a
  // process or one that exited.
  void Stop(absl::Duration grace);
  // SIGKILL and reap (a crash); nothing unless running.
  void Kill();

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// This executable's directory (where the server binaries sit next to it).
std::string SelfDir();
std::string SelfPath();

// Waits for a server's --port_file and returns its key=value pairs.
absl::StatusOr<std::map<std::string, std::string>> WaitForPortFile(
    const std::string& path, Subprocess& process, absl::Duration timeout);

// Waits until the server at `address` reports its "readiness" health
// service SERVING, asked with `credentials` (null: plaintext); fails when
// `process` exits first.
absl::Status WaitForReadiness(
    const std::string& address, Subprocess& process, absl::Duration timeout,
    std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

}  // namespace sluice::cli

#endif  // SLUICE_CLIENT_CLI_SUBPROCESS_H_
