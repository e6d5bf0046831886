#!/usr/bin/python3
"""One rank of the examples' training job: DDP over gloo, data from a Sluice
job through ShardLeaseDataset, a checkpoint after every epoch.

    train.py --job JOB --checkpoint_dir DIR [--epochs N] [--batch B]
             [--record FILE]

Rank, world size and the rendezvous come from the launcher's environment:
SLURM (SLURM_PROCID, SLURM_NTASKS, MASTER_ADDR/MASTER_PORT exported by the
sbatch script), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or
mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE). The coordinator comes
from $SLUICE_COORDINATOR; the scope of Once/Barrier names from
$SLUICE_SCOPE (default: slurm-$SLURM_JOB_ID, so two jobs never share a step).

Every rank gets the same number of batches per epoch (the coordinator splits
the epoch), so DDP's collective calls always match. The checkpoint directory
is created once (sluice.once), and every rank waits for the others at a
barrier before the checkpoint is written, then saves its data position
(ds.state_dict()) with the model. Restarted with the same checkpoint
directory, the job resumes after the last checkpoint. --record appends the
key of every sample this rank trained on (for checking a run; "{rank}" in
the path is replaced by the rank).
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

import sluice
import sluice.torch


def launcher_env():
    """(rank, world, scope) from SLURM, torchrun or Open MPI."""
    env = os.environ
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or env.get("OMPI_COMM_WORLD_RANK") or 0)
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS")
                or env.get("OMPI_COMM_WORLD_SIZE") or 1)
    scope = env.get("SLUICE_SCOPE") or (f"slurm-{env['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in env
                                        else "default")
    return rank, world, scope


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", required=True)
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--record", default="")
    a = p.parse_args()
    rank, world, scope = launcher_env()
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR/PORT
    model = torch.nn.Linear(64, 1)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = sluice.torch.ShardLeaseDataset(os.environ["SLUICE_COORDINATOR"], a.job, rank=rank,
                                        decode=False)
    # One rank creates the checkpoint directory; the others wait for it.
    with sluice.once("mkdir-checkpoints", scope=scope, participant=f"rank-{rank}") as step:
        if step.should_run:
            os.makedirs(a.checkpoint_dir, exist_ok=True)
    path = os.path.join(a.checkpoint_dir, f"rank-{rank}.pt")
    first_epoch = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        ds.load_state_dict(state["data"])
        first_epoch = state["epoch"]
    loader = sluice.torch.DataLoader(ds, batch_size=a.batch, num_workers=a.workers)
    record = open(a.record.format(rank=rank), "a") if a.record else None
    for epoch in range(first_epoch, a.epochs):
        ds.set_epoch(epoch)
        steps = 0
        for batch in loader:
            x = torch.stack([torch.frombuffer(bytearray(b), dtype=torch.uint8)[:64].float()
                             for b in batch["bin"]]) / 255
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP: an all-reduce every rank must join
            opt.step()
            steps += 1
            if record:
                for key in batch["__key__"]:
                    record.write(f"{epoch} {key}\n")
        if record:
            record.write(f"{epoch} steps {steps}\n")
            record.flush()
        # Everyone has finished the epoch before anyone writes a checkpoint.
        sluice.barrier(f"checkpoint-{epoch}", participants=world, id=f"rank-{rank}",
                       scope=scope, timeout=300)
        data = ds.state_dict()  # every rank's cursor (all-gathered under DDP)
        torch.save({"model": model.state_dict(), "data": data, "epoch": epoch + 1}, path + ".tmp")
        os.replace(path + ".tmp", path)
        print(f"rank {rank}/{world}: epoch {epoch}: {steps} steps", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
