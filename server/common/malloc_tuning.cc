#include "server/common/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace sluice {

bool TuneMallocForStreaming() {
#if defined(__GLIBC__)
  // The mmap threshold first: setting either value turns off glibc's
  // dynamic threshold, which would otherwise have grown to the sizes seen.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kTunedMmapThreshold)) == 1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTunedTrimThreshold)) == 1;
#else
  return false;
#endif
}

}  // namespace sluice
