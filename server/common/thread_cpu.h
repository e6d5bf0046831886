// CPU time of the calling thread: what a piece of work cost the process,
// whether or not other threads or processes took the core from it meanwhile
// (a steady clock would count those too). One clock_gettime system call.
#ifndef SLUICE_SERVER_COMMON_THREAD_CPU_H_
#define SLUICE_SERVER_COMMON_THREAD_CPU_H_

#include <time.h>

namespace sluice {

inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) +
         1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_THREAD_CPU_H_
