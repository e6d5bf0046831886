"""glibc malloc settings for processes that stream samples."""
import ctypes
import platform


# glibc's mallopt parameter numbers (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def tune_malloc():
    """Keeps up to 64 MiB of freed memory per glibc malloc arena instead of
    handing it back to the kernel after every megabyte-sized message, and
    serves allocations up to 32 MiB from the arenas. Reading samples
    allocates and frees ~1 MiB buffers many times a second on gRPC's and the
    Reader's threads; with glibc's defaults each one's pages are faulted in
    again, zero-filled (the same setting as the servers' --tune_malloc and
    the C++ sluice::TuneMallocForStreaming(); see
    server/common/malloc_tuning.h for the measurements).

    Process-wide, so it is opt-in: call it once at start-up, or set
    SLUICE_TUNE_MALLOC=1 in the environment (DataLoader workers inherit it)
    and every Reader applies it. The cost is up to 64 MiB of free memory kept
    per malloc arena. Returns False where the C library is not glibc or the
    allocator in use refuses the settings (a preloaded jemalloc/tcmalloc,
    which does not need them)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # The mmap threshold first: setting either turns glibc's dynamic one off.
    return mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1 and mallopt(_M_TRIM_THRESHOLD, 64 << 20) == 1
