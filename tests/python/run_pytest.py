#!/usr/bin/python3
"""Runs pytest (arguments passed on) and, when it exits, stops every process
the run left behind.

ctest reads a test's output until the pipe closes, so a process that
outlives pytest holding it -- a forked DataLoader worker stuck in gRPC's
fork handlers after the test process crashed, or a server whose fixture
never ran its teardown -- would keep the whole test run waiting forever.
This wrapper is a child subreaper (prctl PR_SET_CHILD_SUBREAPER): such
orphans become its children instead of init's, so it can find and kill
them, and they are descendants ctest can kill on a timeout. A test that
runs for more than five minutes dumps every thread's stack (pytest's
faulthandler_timeout) before ctest's timeout ends it.

With --results XML first (how ctest runs a file), the run's outcomes go to
that JUnit XML, each test's ctest entry reads its own from there
(pytest_cases.py), and a run that got through every test exits 0 even when
some failed: the failures are those entries'. Collection errors, an
interrupted run or a crash still fail the file's entry.
"""
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def children():
    pids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return pids


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def main():
    args = sys.argv[1:]
    results = None
    if args[:1] == ["--results"] and len(args) >= 2:
        results = args[1]
        args = args[2:]
        os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
        try:
            os.unlink(results)  # a check never reads an earlier run's outcome
        except FileNotFoundError:
            pass
        args = [f"--junitxml={results}", "-o", "junit_family=xunit2",
                "-o", "junit_logging=all", "-o", "junit_log_passing_tests=False",
                *args]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("run_pytest: cannot become a child subreaper; orphans go to init",
              file=sys.stderr)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-o", "faulthandler_timeout=300",
                             *args])
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    rc = proc.wait()
    # A process that only waits for pytest to go (multiprocessing's resource
    # tracker reads a pipe until it closes) ends by itself: a moment first.
    deadline = time.monotonic() + 2
    while children() and time.monotonic() < deadline:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        time.sleep(0.01)
    left = children()
    for pid in left:
        print(f"run_pytest: killing what the run left behind: {pid} {cmdline(pid)}",
              file=sys.stderr)
    while left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in left:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        left = children()  # their own orphans come to us in turn
    if results is not None and rc == 1 and os.path.exists(results):
        print(f"run_pytest: some tests failed; their own ctest entries name them "
              f"(outcomes in {results})", file=sys.stderr)
        rc = 0
    sys.exit(rc if rc >= 0 else 128 - rc)


if __name__ == "__main__":
    main()
