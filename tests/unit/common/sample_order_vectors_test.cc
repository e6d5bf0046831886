// The sample-order algorithms as protos/README.md specifies them, checked
// against protos/sample_order_vectors.json, which the Python tests
// (tests/python/test_sample_order.py) check a reading of the spec against.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "server/common/mix_order.h"
#include "server/common/shuffle_window.h"

namespace sluice {
namespace {

nlohmann::json Vectors() {
  std::ifstream in(std::string(SLUICE_SOURCE_DIR) +
                   "/protos/sample_order_vectors.json");
  return nlohmann::json::parse(in);
}

uint64_t U64(const nlohmann::json& decimal) {
  return std::stoull(decimal.get<std::string>());
}

TEST(SampleOrderVectorsTest, WindowOrderSeeds) {
  const nlohmann::json cases = Vectors().at("window_order_seed");
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    EXPECT_EQ(WindowOrderSeed(U64(c.at("seed")), c.at("epoch").get<int64_t>(),
                              c.at("window").get<int64_t>()),
              U64(c.at("order_seed")))
        << c.dump();
  }
}

TEST(SampleOrderVectorsTest, WindowLabels) {
  const nlohmann::json cases = Vectors().at("window_labels");
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    const std::vector<uint16_t> labels =
        WindowLabels(c.at("piece_samples").get<std::vector<int64_t>>(),
                     U64(c.at("order_seed")));
    EXPECT_EQ(labels, c.at("labels").get<std::vector<uint16_t>>()) << c.dump();
  }
}

TEST(SampleOrderVectorsTest, ApportionedShares) {
  const nlohmann::json cases = Vectors().at("apportion");
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    EXPECT_EQ(Apportion(c.at("total").get<int64_t>(),
                        c.at("weights").get<std::vector<double>>()),
              c.at("counts").get<std::vector<int64_t>>())
        << c.dump();
  }
}

TEST(SampleOrderVectorsTest, MixOrder) {
  const nlohmann::json cases = Vectors().at("mix_sources");
  ASSERT_FALSE(cases.empty());
  for (const nlohmann::json& c : cases) {
    const auto counts = c.at("counts").get<std::vector<int64_t>>();
    int64_t total = 0;
    for (int64_t n : counts) total += n;
    EXPECT_EQ(MixSources(counts, 0, total),
              c.at("sources").get<std::vector<int32_t>>())
        << c.dump();
  }
}

}  // namespace
}  // namespace sluice
