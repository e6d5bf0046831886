"""The pattern the launcher tests reproduce: each DDP rank takes every
world-th shard (shards[rank::world]) and trains on its own share. With
shards that do not divide evenly, one rank runs out of batches first and
the others wait for it forever in the gradient all-reduce.

    naive_uneven_split.py SHARD_DIR    (under torchrun: RANK, WORLD_SIZE)
"""
import glob
import os
import sys
import tarfile

import torch
import torch.distributed as dist


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    shards = sorted(glob.glob(os.path.join(sys.argv[1], "*.tar")))[rank::world]
    samples = []
    for path in shards:
        with tarfile.open(path) as tar:
            samples += [tar.extractfile(m).read() for m in tar.getmembers()
                        if m.name.endswith(".bin")]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = 0
    for i in range(0, len(samples), 10):
        x = torch.stack([torch.frombuffer(bytearray(b), dtype=torch.uint8)[:64].float()
                         for b in samples[i:i + 10]]) / 255
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    print(f"rank {rank}: {steps} steps, done", flush=True)
    dist.barrier()  # wait for the others before leaving, as training scripts do
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
