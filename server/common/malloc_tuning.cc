#include "server/common/malloc_tuning.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
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

namespace {

// Whether `address` lies in the main program (not a shared library).
bool InMainProgram(void* address) {
  Dl_info info;
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return false;
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return false;
  exe[n] = '\0';
  char* resolved = realpath(info.dli_fname, nullptr);
  if (resolved == nullptr) return false;
  const bool same = std::strcmp(resolved, exe) == 0;
  std::free(resolved);
  return same;
}

}  // namespace

bool GlibcMallocInUse() {
  if (MallocProvider().rfind("libc.so", 0) == 0) return true;
  // A program built without PIE that takes malloc's address (Debian's
  // python3) makes its own PLT entry the address every lookup sees. Its
  // malloc is glibc's unless another allocator or a sanitizer is loaded.
  if (!InMainProgram(dlsym(RTLD_DEFAULT, "malloc"))) return false;
  for (const char* marker : {"mallctl", "tc_malloc", "mi_malloc", "__asan_init",
                             "__tsan_init", "__msan_init", "__hwasan_init"}) {
    if (dlsym(RTLD_DEFAULT, marker) != nullptr) return false;
  }
  return true;
}

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
