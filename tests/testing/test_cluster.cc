#include "tests/testing/test_cluster.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/testing/http.h"
#include "tests/testing/process.h"

namespace sluice::testing {

namespace {

cli::LocalClusterOptions TestClusterOptions(const std::string& dir) {
  cli::LocalClusterOptions o;
  o.dir = dir;
  o.bin_dir = BinDir();
  o.shards_dir = dir + "/shards";
  o.coordinator_flags = {"--heartbeat_interval=200ms"};
  return o;
}

}  // namespace

TestCluster::TestCluster(std::string dir)
    : dir_(std::move(dir)), cluster_(TestClusterOptions(dir_)) {
  mkdir(shards_dir().c_str(), 0755);
}

std::string TestCluster::WriteShard(
    const std::string& name, int samples,
    const std::function<void(TarWriter&, int)>& sample) {
  TarWriter tar;
  for (int i = 0; i < samples; ++i) sample(tar, i);
  const std::string path = absl::StrCat(shards_dir(), "/", name, ".tar");
  WriteFile(path, tar.Finish());
  return path;
}

std::string TestCluster::CoordinatorLog() {
  if (coordinator().log_path.empty()) return "";
  return ReadWholeFile(coordinator().log_path).value_or("");
}

}  // namespace sluice::testing
