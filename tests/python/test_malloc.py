"""sluice.tune_malloc(): megabyte buffers freed and allocated again on a
thread stop costing page faults (what reading samples does per message).
Each measurement runs in a fresh interpreter: the setting is process-wide."""
import os
import subprocess
import sys

import pytest

_MEASURE = r"""
import os, resource, sys, threading
import sluice
if sys.argv[1] == "call":
    assert sluice.tune_malloc() is True
elif sys.argv[1] == "env":
    os.environ["SLUICE_TUNE_MALLOC"] = "1"
    try:
        sluice.Reader("127.0.0.1:1", "job", reconnect_timeout=0.1).close()
    except sluice.ReaderError:
        pass
per_round = []
def run():  # not the main thread: its own malloc arena, as gRPC's threads
    for _ in range(2):  # a warm-up round, then the measured one
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(100):
            buffers = [b"\x01" * ((1 << 20) + i * 4096) for i in range(4)]
            del buffers
        per_round.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
t = threading.Thread(target=run)
t.start()
t.join()
print(per_round[-1])
"""


def _faults_per_round(how):
    env = dict(os.environ)
    env.pop("SLUICE_TUNE_MALLOC", None)
    out = subprocess.run([sys.executable, "-c", _MEASURE, how], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="glibc's malloc")
def test_tune_malloc_stops_megabyte_buffers_faulting_pages_in_again():
    untuned = _faults_per_round("none")
    assert untuned >= 500, "glibc's defaults no longer reproduce the problem"
    assert _faults_per_round("call") <= 2, f"untuned: {untuned} faults per round"


@pytest.mark.skipif(os.uname().sysname != "Linux", reason="glibc's malloc")
def test_sluice_tune_malloc_1_in_the_environment_makes_a_reader_apply_it():
    assert _faults_per_round("env") <= 2
