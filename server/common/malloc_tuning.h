// glibc malloc settings for processes that move megabyte-sized buffers.
//
// Sluice's data path allocates and frees buffers of about a megabyte many
// times a second (gRPC read slices, SampleBatch messages, decoded images),
// mostly on threads other than main. With glibc's defaults every free that
// leaves more than the trim threshold at the top of a thread's arena gives
// the pages back to the kernel (madvise), and the next buffer faults them in
// again, zero-filled: measured on a 1 MiB-per-batch stream, ~250 page faults
// per buffer, and 25-35 % of a reader's throughput. Keeping up to 64 MiB of
// free memory per arena (and serving allocations up to 32 MiB from the
// arenas instead of fresh mmaps) removes them.
//
// The cost is memory the process keeps instead of returning: at most the
// trim threshold of free space per malloc arena. Servers apply it at start
// (--tune_malloc=false to keep glibc's defaults); client programs opt in by
// calling TuneMallocForStreaming() (sluice/reader.h) or sluice.tune_malloc().
#ifndef SLUICE_SERVER_COMMON_MALLOC_TUNING_H_
#define SLUICE_SERVER_COMMON_MALLOC_TUNING_H_

#include <cstdint>
#include <string>

namespace sluice {

inline constexpr int64_t kTunedMmapThreshold = int64_t{32} << 20;
inline constexpr int64_t kTunedTrimThreshold = int64_t{64} << 20;

// The file name of the object whose malloc this process calls: a shared
// library ("libc.so.6", "libjemalloc.so.2": the coordinator links jemalloc,
// see the top-level CMakeLists.txt), the executable itself when a malloc is
// linked in statically, or "" if the dynamic linker cannot tell.
std::string MallocProvider();
// Whether that malloc is glibc's (the one TuneMallocForStreaming tunes):
// the provider is libc, or the main program's own PLT entry (a program
// built without PIE) while no other allocator or sanitizer is loaded.
bool GlibcMallocInUse();

// Sets glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD to the values above for
// the whole process. Returns false when malloc is not glibc's (ASan's,
// jemalloc linked or preloaded: they do not need these settings) or it
// refuses them. Safe to call more than once.
bool TuneMallocForStreaming();

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_MALLOC_TUNING_H_
