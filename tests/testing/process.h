// Real child processes for integration tests: start a binary, wait for its
// port file, signal it, wait for its exit with a deadline. Every process is
// stopped by its own PID (SIGKILL in the destructor if still running).
#ifndef SLUICE_TESTS_TESTING_PROCESS_H_
#define SLUICE_TESTS_TESTING_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/cli/local_cluster.h"
#include "client/cli/subprocess.h"

namespace sluice::testing {

// Directory holding the built binaries (build/bin).
std::string BinDir();

// Reads "key=value" lines (the servers' --port_file format).
std::map<std::string, std::string> ParseKeyValueFile(const std::string& text);

// Reads a whole file; empty optional when it cannot be opened.
std::optional<std::string> ReadWholeFile(const std::string& path);

// A child process for a test: cli::Subprocess (the one implementation,
// which sluicectl uses too) with stdout and stderr appended to one log.
class ChildProcess {
 public:
  // Starts `argv[0]` (a path) with `argv`; stdout and stderr go to
  // `log_path` (appended) when set.
  static absl::StatusOr<ChildProcess> Start(
      const std::vector<std::string>& argv, const std::string& log_path = "");
  // An empty handle (no process).
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept = default;
  ChildProcess& operator=(ChildProcess&& other) noexcept = default;
  ~ChildProcess() = default;  // SIGKILLs and reaps a child still running

  pid_t pid() const { return process_.pid(); }
  bool running() { return process_.running(); }
  void Signal(int signo) { process_.Signal(signo); }
  // Waits for exit; returns the exit code, or 128+signal when killed,
  // DEADLINE_EXCEEDED, or FAILED_PRECONDITION for an empty handle.
  absl::StatusOr<int> Wait(absl::Duration timeout) {
    return process_.Wait(timeout);
  }
  // SIGKILL and reap.
  void Kill() { process_.Kill(); }

 private:
  cli::Subprocess process_;
};

// A server binary with its addresses (cli::ServerProcess, the type
// cli::LocalCluster's members have).
using ServerProcess = cli::ServerProcess;

// Starts build/bin/`binary` (e.g. "sluice-coordinator") with
// --listen=127.0.0.1:0, --metrics_listen=127.0.0.1:0 and --port_file in
// `dir`, plus `extra_args` (which win), and waits until its port file
// appears (or it exits, or `timeout` passes). A coordinator keeps its
// journal in `dir` unless --journal_dir is given; a data server serves `dir`
// unless --roots is given. Its output goes to a log in `dir` (log_path).
absl::StatusOr<ServerProcess> StartServer(
    const std::string& binary, const std::string& dir,
    const std::vector<std::string>& extra_args = {},
    absl::Duration timeout = absl::Seconds(20));

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_PROCESS_H_
