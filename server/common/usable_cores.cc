#include "server/common/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// cgroup v2: "max 100000" (no limit) or "QUOTA PERIOD".
std::optional<double> FromCpuMax(const std::string& dir) {
  std::optional<std::string> text = ReadFile(dir + "/cpu.max");
  if (!text.has_value()) return std::nullopt;
  std::vector<std::string> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ');
  double quota = 0, period = 0;
  if (parts.size() != 2 || !absl::SimpleAtod(parts[0], &quota) ||
      !absl::SimpleAtod(parts[1], &period) || quota <= 0 || period <= 0) {
    return std::nullopt;
  }
  return quota / period;
}

// cgroup v1: cpu.cfs_quota_us (-1: no limit) over cpu.cfs_period_us.
std::optional<double> FromCfs(const std::string& dir) {
  std::optional<std::string> quota_text = ReadFile(dir + "/cpu.cfs_quota_us");
  std::optional<std::string> period_text = ReadFile(dir + "/cpu.cfs_period_us");
  double quota = 0, period = 0;
  if (!quota_text.has_value() || !period_text.has_value() ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*quota_text), &quota) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(*period_text), &period) ||
      quota <= 0 || period <= 0) {
    return std::nullopt;
  }
  return quota / period;
}

}  // namespace

std::optional<double> CgroupCpuLimit(const std::string& proc_self_cgroup,
                                     const std::string& cgroup_root) {
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    // hierarchy-ID:controller-list:cgroup-path
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::string& path = f[2] == "/" ? std::string() : f[2];
    std::vector<std::string> dirs;
    if (f[0] == "0" && f[1].empty()) {  // v2
      for (const char* base : {"", "/unified"}) {
        dirs.push_back(cgroup_root + base + path);
        dirs.push_back(cgroup_root + base);
      }
      for (const std::string& dir : dirs) {
        if (auto limit = FromCpuMax(dir)) return limit;
      }
      continue;
    }
    std::vector<std::string> controllers = absl::StrSplit(f[1], ',');
    if (std::find(controllers.begin(), controllers.end(), "cpu") ==
        controllers.end()) {
      continue;
    }
    for (const std::string& name : {f[1], std::string("cpu")}) {
      dirs.push_back(cgroup_root + "/" + name + path);
      dirs.push_back(cgroup_root + "/" + name);
    }
    for (const std::string& dir : dirs) {
      if (auto limit = FromCfs(dir)) return limit;
    }
  }
  return std::nullopt;
}

int UsableCores() {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = CPU_COUNT(&set);
  if (std::optional<std::string> cgroup = ReadFile("/proc/self/cgroup")) {
    if (std::optional<double> limit =
            CgroupCpuLimit(*cgroup, "/sys/fs/cgroup")) {
      cores = std::min(cores, static_cast<int>(std::ceil(*limit)));
    }
  }
  return std::max(cores, 1);
}

}  // namespace sluice
