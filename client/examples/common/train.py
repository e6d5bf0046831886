#!/usr/bin/python3
"""One rank of the examples' training job: DDP over gloo, data from a Sluice
job through ShardLeaseDataset, a checkpoint after every epoch.

    train.py --job JOB --checkpoint_dir DIR [--epochs N] [--batch B]
             [--workers W] [--checkpoint_every N] [--step_seconds S]
             [--record FILE]

Rank, world size and the rendezvous come from the launcher's environment:
SLURM (SLURM_PROCID, SLURM_NTASKS, MASTER_ADDR/MASTER_PORT exported by the
sbatch script), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or
mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE). The coordinator comes
from $SLUICE_COORDINATOR; the scope of Once/Barrier names from
$SLUICE_SCOPE, else the launcher's run and restart (sluice.once's default),
so two runs never share a step.

Every rank gets the same number of batches per epoch (the coordinator splits
the epoch), so DDP's collective calls always match. The checkpoint directory
is created once (sluice.once), and every rank waits for the others at a
barrier before rank 0 writes the run's checkpoint: the model, the optimizer
and every rank's data position (ds.state_dict()). Restarted with the same
checkpoint directory (torchrun --max_restarts, a requeued SLURM job), every
rank resumes exactly after the last checkpoint. A restart with another
number of ranks (torchrun --nnodes=MIN:MAX after a node left or joined)
resumes the same way: ShardLeaseDataset reads the job's copy for the new
world size, which continues the epoch from the checkpoint's cursor.
--record writes, at the end, the key of every sample the final model was
trained on, with the launch (restart) and the rank that trained it, and the
steps per epoch (for checking a run; "{rank}" in the path is replaced by the rank).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import sluice
import sluice.torch


def launcher_env():
    """(rank, world) from SLURM, torchrun or Open MPI."""
    env = os.environ
    rank = int(env.get("RANK") or env.get("SLURM_PROCID") or env.get("OMPI_COMM_WORLD_RANK") or 0)
    world = int(env.get("WORLD_SIZE") or env.get("SLURM_NTASKS")
                or env.get("OMPI_COMM_WORLD_SIZE") or 1)
    return rank, world


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--job", required=True)
    p.add_argument("--checkpoint_dir", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--checkpoint_every", type=int, default=0,
                   help="also checkpoint every N steps within an epoch (0: at epoch ends)")
    p.add_argument("--step_seconds", type=float, default=0,
                   help="sleep this long in every step (a slower model)")
    p.add_argument("--record", default="")
    a = p.parse_args()
    rank, world = launcher_env()
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)  # MASTER_ADDR/PORT
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 1)  # saved without DDP's wrapper: any world size loads it
    model = net
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # A restart of the run (torchrun --max_restarts, a requeued SLURM job, a
    # relaunch by hand) restores the checkpoint again: load_state_dict() is
    # a restore of its own each time, nothing to pass.
    ds = sluice.torch.ShardLeaseDataset(os.environ["SLUICE_COORDINATOR"], a.job, rank=rank,
                                        decode=False)
    # One rank creates the checkpoint directory; the others wait for it. The
    # step is named by the directory, in the launcher's run's scope.
    checkpoint_dir = os.path.abspath(a.checkpoint_dir)
    with sluice.once(f"mkdir:{checkpoint_dir}", participant=f"rank-{rank}") as step:
        if step.should_run:
            os.makedirs(checkpoint_dir, exist_ok=True)
    # One checkpoint for the run, written by rank 0: the model (the same on
    # every rank under DDP), the optimizer, every rank's data cursor
    # (ds.state_dict() all-gathers them) and, for --record, what each rank
    # trained on. Every rank restores from it.
    path = os.path.join(checkpoint_dir, "checkpoint.pt")
    state = {"epoch": 0, "steps": {}, "trained": {r: [] for r in range(world)}, "launch": 0}
    if os.path.exists(path):
        state = torch.load(path)
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        ds.load_state_dict(state["data"])
    # Every rank of one launch restores the same checkpoint: the same number.
    launch = state["launch"] = state.get("launch", 0) + 1
    # What the ranks of the checkpoint's run trained on, also when it had
    # another number of ranks: this rank keeps the lists of ranks rank,
    # rank + world, rank + 2 * world, ...
    trained = [entry for r in sorted(state["trained"]) if r % world == rank
               for entry in state["trained"][r]]
    loader = sluice.torch.DataLoader(ds, batch_size=a.batch, num_workers=a.workers)

    def checkpoint(epoch, name):
        # Everyone reaches the same step before the checkpoint is taken.
        sluice.barrier(f"checkpoint-{name}-of-{world}", participants=world,
                       participant=f"rank-{rank}", timeout=300)
        data = ds.state_dict()  # every rank's cursor (all-gathered under DDP)
        every = [trained]
        if world > 1:
            every = [None] * world
            dist.all_gather_object(every, trained)
        if rank == 0:
            state.update(model=net.state_dict(), optimizer=opt.state_dict(), data=data,
                         epoch=epoch, trained=dict(enumerate(every)))
            torch.save(state, path + ".tmp")
            os.replace(path + ".tmp", path)  # a crash never leaves half a checkpoint
            print(f"rank 0/{world}: checkpoint {name} (launch {launch})", flush=True)

    for epoch in range(state["epoch"], a.epochs):
        ds.set_epoch(epoch)
        for batch in loader:
            x = torch.stack([torch.frombuffer(bytearray(b), dtype=torch.uint8)[:64].float()
                             for b in batch["bin"]]) / 255
            if a.step_seconds:
                time.sleep(a.step_seconds)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()  # DDP: an all-reduce every rank must join
            opt.step()
            steps = state["steps"][epoch] = state["steps"].get(epoch, 0) + 1
            if a.record:
                trained.extend((epoch, key, launch, rank) for key in batch["__key__"])
            if a.checkpoint_every and steps % a.checkpoint_every == 0:
                checkpoint(epoch, f"{epoch}-{steps}")
        checkpoint(epoch + 1, f"{epoch}-end")
        print(f"rank {rank}/{world}: epoch {epoch}: {state['steps'].get(epoch, 0)} steps",
              flush=True)
    if a.record:
        with open(a.record.format(rank=rank), "w") as f:
            for epoch, key, launch, by in trained:
                f.write(f"{epoch} {key} {launch} {by}\n")
            for epoch, steps in sorted(state["steps"].items()):
                f.write(f"{epoch} steps {steps}\n")
    if world > 1:
        # Every rank is done before any tears down, and DDP's reducer goes
        # before its process group: gloo's destructor otherwise waits forever
        # for peers that already left (torch 1.13).
        dist.barrier()
        del model, net, opt
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
