"""The pattern the launcher tests reproduce: a shard cache on a shared
filesystem guarded by lock files, as WebDataset's cache does: the first task
creates SHARD.lock, downloads, and removes the lock; the others wait while
the lock exists, then open the cached file. When the lock file vanishes
under it (NFS attribute caching, a tmp cleaner, another job's cleanup), the
holder's release and the waiters' reads fail with FileNotFoundError.

    naive_lock_cache.py URL CACHE_DIR DOWNLOAD_SECONDS
"""
import os
import sys
import time
import urllib.request


def cached(url, cache_dir, download_seconds):
    path = os.path.join(cache_dir, os.path.basename(url))
    lock = path + ".lock"
    if not os.path.exists(path):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            while os.path.exists(lock):  # someone else is downloading
                time.sleep(0.05)
        else:
            os.close(fd)
            data = urllib.request.urlopen(url).read()
            time.sleep(download_seconds)  # a large shard over a slow link
            tmp = f"{path}.{os.getpid()}.tmp"  # per task: only the lock is shared
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
            os.remove(lock)  # release
    with open(path, "rb") as f:
        return f.read()


def main():
    data = cached(sys.argv[1], sys.argv[2], float(sys.argv[3]))
    print(f"task {os.environ.get('SLURM_PROCID')}: {len(data)} bytes", flush=True)


if __name__ == "__main__":
    main()
