#!/usr/bin/python3
"""Prepare a dataset once under mpirun; every process then loads it.

    mpirun -np 4 python3 preprocess_once.py DATA_DIR

What PyTorch Geometric and most MPI programs do by default is let every
process download and preprocess the same dataset (N downloads, N writers
racing on the same files); `--every_rank` does that, for comparison. Here
one process runs the step through sluice.once and the others wait for it,
then everyone loads the result. A process that dies while preparing hands
the step to a waiting one after the TTL; a finished step is never run again
in the same scope, even after a coordinator restart.

Environment: SLUICE_COORDINATOR (the coordinator's address); SLUICE_SCOPE
(default: mpi-$OMPI_MCA_ess_base_jobid, so two mpirun jobs never share a
step). Prints one line per process: {"rank": R, "shards": N, "samples": M}.
"""
import argparse
import glob
import json
import os
import sys
import tarfile

from mpi4py import MPI

import sluice

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import prepare  # noqa: E402  (the examples' dataset preparation)


def load(data_dir):
    shards = sorted(glob.glob(os.path.join(data_dir, "shards", "*.tar")))
    samples = 0
    for path in shards:
        with tarfile.open(path) as tar:
            samples += sum(1 for m in tar.getmembers() if m.name.endswith(".cls"))
    return len(shards), samples


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data_dir")
    p.add_argument("--every_rank", action="store_true",
                   help="every process prepares the dataset itself (the pattern this replaces)")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    scope = os.environ.get("SLUICE_SCOPE") or \
        f"mpi-{os.environ.get('OMPI_MCA_ess_base_jobid', 'default')}"
    argv = [a.data_dir, "--shards", "4", "--per_shard", "25"]
    if a.every_rank:
        prepare.main(argv)
    else:
        with sluice.once("preprocess", scope=scope, participant=f"rank-{rank}") as step:
            if step.should_run:
                prepare.main(argv)
    shards, samples = load(a.data_dir)
    print(json.dumps({"rank": rank, "shards": shards, "samples": samples}), flush=True)
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
