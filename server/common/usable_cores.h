// How many CPUs this process can use: the CPUs its affinity mask allows,
// lowered to its cgroup's CPU quota, as a container's CPU limit sets it
// (Kubernetes' resources.limits.cpu, podman --cpus, SLURM's cgroup
// confinement). std::thread::hardware_concurrency() counts every CPU of
// the machine, so a pod limited to 2 CPUs on a 64-core node would start 64
// decode threads and report 64 cores of capacity.
#ifndef SLUICE_SERVER_COMMON_USABLE_CORES_H_
#define SLUICE_SERVER_COMMON_USABLE_CORES_H_

#include <optional>
#include <string>

namespace sluice {

// The CPU quota of the cgroup the process is in, in CPUs (e.g. 1.5), or
// nullopt when none is set or it cannot be read. `proc_self_cgroup` is the
// text of /proc/self/cgroup; cgroup v2 reads `cgroup_root`/PATH/cpu.max
// (also under `cgroup_root`/unified on hybrid hosts), v1
// `cgroup_root`/CONTROLLERS/PATH/cpu.cfs_quota_us and cpu.cfs_period_us;
// each at the process's path, then at the root (a cgroup namespace shows
// the container's own cgroup there).
std::optional<double> CgroupCpuLimit(const std::string& proc_self_cgroup,
                                     const std::string& cgroup_root);

// max(1, min(CPUs in the affinity mask, ceil(the cgroup CPU quota))), from
// /proc/self/cgroup and /sys/fs/cgroup.
int UsableCores();

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_USABLE_CORES_H_
