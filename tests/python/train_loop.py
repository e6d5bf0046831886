"""The README's PyTorch loop as a user runs it, for the tests: a
ShardLeaseDataset in sluice.torch.DataLoader, a training step that takes
real time, a checkpoint after every step, optional DDP over gloo.

    train_loop.py COORDINATOR JOB --workers=2 --start=fork --persistent
                  --step=0.1 --epochs=2 --checkpoint=PATH [--world=2 --rank=R --init=FILE]
                  [--kill_after=N] [--frozen]

The checkpoint holds what a real one would: the model's state (here, the
list of samples trained on, standing in for the weights) and the data
cursor, written together atomically after each step. With an existing
checkpoint the run resumes from it. Prints one JSON line at the end:
{"rank", "steps_per_epoch", "trained": [[epoch, shard, index], ...]}.
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import sluice.torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("coordinator")
    p.add_argument("job")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--start", default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--step", type=float, default=0.0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--init", default="")
    p.add_argument("--attempt", default=None)
    p.add_argument("--kill_after", type=int, default=0,
                   help="SIGKILL this process after N steps of this run (after their checkpoint)")
    p.add_argument("--frozen", action="store_true",
                   help="write no checkpoint in this run (it resumed and dies before its next)")
    a = p.parse_args()

    if a.world > 1:
        dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank,
                                world_size=a.world)
    ds = sluice.torch.ShardLeaseDataset(a.coordinator, a.job, decode=True,
                                        resume_attempt=a.attempt)

    def save(state):
        if a.frozen:
            return
        with open(a.checkpoint + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(a.checkpoint + ".tmp", a.checkpoint)

    run_steps = 0
    trained, first_epoch = [], 0
    if os.path.exists(a.checkpoint):
        with open(a.checkpoint) as f:
            state = json.load(f)
        trained = state["trained"]
        ds.load_state_dict({"cursor": bytes.fromhex(state["cursor"])})
        first_epoch = state["epoch"]
    loader = sluice.torch.DataLoader(
        ds, batch_size=a.batch, num_workers=a.workers,
        multiprocessing_context=a.start if a.workers else None,
        persistent_workers=a.persistent and a.workers > 0)
    steps_per_epoch = {}
    for epoch in range(first_epoch, a.epochs):
        ds.set_epoch(epoch)
        steps = 0
        for batch in loader:
            time.sleep(a.step)  # the model's forward and backward pass
            if a.world > 1:
                t = torch.ones(1)
                dist.all_reduce(t)  # every rank takes part in every step
            steps += 1
            trained.extend([e, s, i] for e, s, i in zip(
                batch["__epoch__"].tolist(), batch["__shard__"], batch["__index__"].tolist()))
            save({"epoch": epoch, "trained": trained, "cursor": ds.state_dict()["cursor"].hex()})
            run_steps += 1
            if run_steps == a.kill_after:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        steps_per_epoch[epoch] = steps
        # The pass is over: a restart from here begins the next epoch.
        save({"epoch": epoch + 1, "trained": trained, "cursor": ds.state_dict()["cursor"].hex()})
    ds.close()
    if a.world > 1:
        dist.destroy_process_group()
    print(json.dumps({"rank": a.rank, "steps_per_epoch": steps_per_epoch, "trained": trained,
                      "skipped": ds.skipped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
