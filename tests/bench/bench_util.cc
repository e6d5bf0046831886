#include "tests/bench/bench_util.h"

#include "absl/strings/str_cat.h"
#include "tests/testing/image_fixtures.h"
#include "tests/testing/tar_writer.h"

namespace sluice::bench {

std::vector<std::string> MakeJpegs() {
  std::vector<std::string> jpegs;
  for (int i = 0; i < 16; ++i) {
    jpegs.push_back(
        testing::EncodeJpeg(testing::TestPixels(500, 375, 3, i), 500, 375, 92));
  }
  return jpegs;
}

std::vector<std::pair<std::string, int64_t>> WriteShards(
    const std::string& dir, int shards, int per_shard,
    const std::vector<std::string>& jpegs) {
  std::vector<std::pair<std::string, int64_t>> units;
  for (int s = 0; s < shards; ++s) {
    testing::TarWriter tar;
    for (int i = 0; i < per_shard; ++i) {
      std::string key = absl::StrCat("s", s, "/", i);
      tar.File(key + ".jpg",
               jpegs[static_cast<size_t>(s * per_shard + i) % jpegs.size()])
          .File(key + ".cls", std::to_string(i % 1000));
    }
    std::string path = absl::StrCat(dir, "/shard-", s, ".tar");
    testing::WriteFile(path, tar.Finish());
    units.emplace_back(path, per_shard);
  }
  return units;
}

}  // namespace sluice::bench
