#include "server/common/malloc_tuning.h"

#include <dlfcn.h>

#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace sluice {

std::string MallocProvider() {
  // The definition the dynamic linker binds malloc to for the whole process
  // (the global scope, in load order: a preload, then the executable's
  // libraries in link order).
  void* malloc_fn = dlsym(RTLD_DEFAULT, "malloc");
  Dl_info info;
  if (malloc_fn == nullptr || dladdr(malloc_fn, &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const char* slash = std::strrchr(info.dli_fname, '/');
  return slash == nullptr ? info.dli_fname : slash + 1;
}

bool GlibcMallocInUse() { return MallocProvider().rfind("libc.so", 0) == 0; }

bool TuneMallocForStreaming() {
#if defined(__GLIBC__)
  if (!GlibcMallocInUse()) return false;
  // The mmap threshold first: setting either value turns off glibc's
  // dynamic threshold, which would otherwise have grown to the sizes seen.
  return mallopt(M_MMAP_THRESHOLD, static_cast<int>(kTunedMmapThreshold)) ==
             1 &&
         mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTunedTrimThreshold)) == 1;
#else
  return false;
#endif
}

}  // namespace sluice
