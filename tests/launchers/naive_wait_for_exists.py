"""The pattern the launcher tests reproduce: rank 0 creates a directory,
the others poll for it with a timeout (OLMo's wait_for(exists)).

    naive_wait_for_exists.py DIR RANK0_DELAY_S TIMEOUT_S
"""
import os
import sys
import time


def wait_for(condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("timed out waiting for the checkpoint directory")
        time.sleep(0.05)


def main():
    path, delay, timeout = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    if int(os.environ["SLURM_PROCID"]) == 0:
        time.sleep(delay)  # a slow rank 0 (loading, a busy filesystem)
        os.makedirs(path)
    else:
        wait_for(lambda: os.path.exists(path), timeout)


if __name__ == "__main__":
    main()
