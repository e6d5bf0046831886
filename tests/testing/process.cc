#include "tests/testing/process.h"

#include <signal.h>

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
  absl::StatusOr<cli::Subprocess> process =
      cli::Subprocess::Spawn(argv, log_path, log_path);
  if (!process.ok()) return process.status();
  ChildProcess child;
  child.process_ = std::move(*process);
  return child;
}

absl::StatusOr<ServerProcess> StartServer(
    const std::string& binary, const std::string& dir,
    const std::vector<std::string>& extra_args, absl::Duration timeout) {
  static int counter = 0;
  const std::string tag = absl::StrCat(binary, "-", counter++);
  std::vector<std::string> argv = {BinDir() + "/" + binary,
                                   "--listen=127.0.0.1:0"};
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
  return cli::StartServer(argv, absl::StrCat(dir, "/", tag, ".ports"),
                          absl::StrCat(dir, "/", tag, ".log"), timeout);
}

}  // namespace sluice::testing
