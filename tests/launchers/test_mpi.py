"""The MPI example under Debian's Open MPI mpirun: every process preparing
the dataset (what PyTorch Geometric's datasets do under mpirun), then the
example preparing it once while the others wait and load."""
import json
import os
import re
import subprocess

import pytest

from conftest import EXAMPLES, LocalSluice

PYTHON = "/usr/bin/python3"  # Debian's, with mpi4py and grpcio
SCRIPT = os.path.join(EXAMPLES, "mpi", "preprocess_once.py")


def mpirun(n, args, env):
    # Root in CI: Open MPI refuses it without --allow-run-as-root; 4 ranks on
    # 2 cores need --oversubscribe.
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n)]
    for name in env:
        argv += ["-x", name]
    out = subprocess.run(argv + [PYTHON, SCRIPT] + args, env=dict(os.environ, **env),
                         capture_output=True, text=True, timeout=300)
    # Ranks' lines may interleave on mpirun's stdout: take each object.
    lines = [json.loads(m) for m in re.findall(r"\{[^{}]*\}", out.stdout)]
    return out, lines


@pytest.fixture(scope="module")
def sluice_cluster(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("sluice"))
    c = LocalSluice(d, os.path.join(d, "shards"))
    yield c
    c.stop()


def test_every_rank_prepares_under_mpirun_and_the_example_prepares_once(sluice_cluster, tmp_path):
    before_dir = str(tmp_path / "every")
    out, lines = mpirun(4, [before_dir, "--every_rank"], {})
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(before_dir, "prepare.log")) as f:
        assert len(f.readlines()) == 4  # four downloads and preprocessings
    after_dir = str(tmp_path / "once")
    out, lines = mpirun(4, [after_dir], {"SLUICE_COORDINATOR": sluice_cluster.address,
                                         "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(after_dir, "prepare.log")) as f:
        assert len(f.readlines()) == 1
    assert sorted(l["rank"] for l in lines) == [0, 1, 2, 3]
    assert all(l["shards"] == 4 and l["samples"] == 100 for l in lines), lines
    # Another mpirun is another scope: its step runs again.
    out, _ = mpirun(2, [after_dir], {"SLUICE_COORDINATOR": sluice_cluster.address,
                                     "PYTHONPATH": os.environ.get("PYTHONPATH", "")})
    assert out.returncode == 0, out.stdout + out.stderr
    with open(os.path.join(after_dir, "prepare.log")) as f:
        assert len(f.readlines()) == 2
