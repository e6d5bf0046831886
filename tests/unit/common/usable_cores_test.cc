#include "server/common/usable_cores.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/testing/temp_dir.h"

namespace sluice {
namespace {

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(
      std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(CgroupCpuLimitTest, ReadsCgroupV2CpuMaxAtTheProcessPath) {
  testing::TempDir root;
  Write(root.File("kubepods/pod1/cpu.max"), "200000 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/kubepods/pod1\n", root.path()), 2.0);
}

TEST(CgroupCpuLimitTest, AV2CgroupWithoutAQuotaHasNoLimit) {
  testing::TempDir root;
  Write(root.File("cpu.max"), "max 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/\n", root.path()), std::nullopt);
}

TEST(CgroupCpuLimitTest, ANamespacedV2CgroupIsReadAtTheRoot) {
  // Inside a cgroup namespace the path names the host's hierarchy, and the
  // container's own cgroup is mounted at the root.
  testing::TempDir root;
  Write(root.File("cpu.max"), "150000 100000\n");
  EXPECT_EQ(CgroupCpuLimit("0::/system.slice/x.scope\n", root.path()), 1.5);
}

TEST(CgroupCpuLimitTest, ReadsCgroupV1CfsQuotaOnAHybridHost) {
  testing::TempDir root;
  Write(root.File("cpu,cpuacct/docker/abc/cpu.cfs_quota_us"), "50000\n");
  Write(root.File("cpu,cpuacct/docker/abc/cpu.cfs_period_us"), "100000\n");
  EXPECT_EQ(CgroupCpuLimit("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n"
                           "0::/docker/abc\n",
                           root.path()),
            0.5);
}

TEST(CgroupCpuLimitTest, AnUnlimitedOrUnreadableV1CgroupHasNoLimit) {
  testing::TempDir root;
  Write(root.File("cpu/cpu.cfs_quota_us"), "-1\n");
  Write(root.File("cpu/cpu.cfs_period_us"), "100000\n");
  EXPECT_EQ(CgroupCpuLimit("1:cpu:/\n", root.path()), std::nullopt);
  EXPECT_EQ(CgroupCpuLimit("1:cpu:/missing\n", root.path() + "/nowhere"),
            std::nullopt);
  EXPECT_EQ(CgroupCpuLimit("garbage", root.path()), std::nullopt);
}

TEST(UsableCoresTest, IsAtLeastOneAndAtMostTheMachinesCpus) {
  const int cores = UsableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace sluice
