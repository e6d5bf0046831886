"""Resume cursors (G7): merging every rank's (and worker's) into one."""
from sluice.v1 import common_pb2


def merge_cursors(cursors):
    """Combines the ranks' (and workers') cursors (same job, epoch, world
    size, workers per rank) into one with every count; ValueError on a
    mismatch or conflicting counts."""
    cursors = list(cursors)
    if not cursors:
        raise ValueError("merge_cursors: no cursors")
    merged = common_pb2.Cursor()
    merged.CopyFrom(cursors[0])

    def shape(c):
        return (c.job, c.epoch, c.world_size, len(c.consumed_per_rank), c.workers_per_rank,
                len(c.consumed_per_worker))

    for i, c in enumerate(cursors[1:], 1):
        if shape(c) != shape(merged):
            raise ValueError(f"merge_cursors: cursor {i} is job {c.job} epoch {c.epoch} world_size "
                             f"{c.world_size} workers_per_rank {c.workers_per_rank}, cursor 0 is "
                             f"job {merged.job} epoch {merged.epoch} world_size "
                             f"{merged.world_size} workers_per_rank {merged.workers_per_rank}")
        # Source names: each cursor knows those its reader's leases named.
        for k, name in enumerate(c.sources):
            if k >= len(merged.sources):
                merged.sources.append("")
            if not name:
                continue
            if merged.sources[k] and merged.sources[k] != name:
                raise ValueError(f"merge_cursors: cursor {i} names source {k} {name!r}, "
                                 f"another cursor {merged.sources[k]!r}")
            merged.sources[k] = name
        for what, mine, theirs in (("rank", merged.consumed_per_rank, c.consumed_per_rank),
                                   ("worker slot", merged.consumed_per_worker,
                                    c.consumed_per_worker)):
            for r, n in enumerate(theirs):
                if n < 0:
                    continue
                if mine[r] >= 0 and mine[r] != n:
                    raise ValueError(f"merge_cursors: {what} {r} has two counts, {mine[r]} and {n}")
                mine[r] = n
    workers = merged.workers_per_rank
    if workers > 1:  # a rank's count is its workers' sum once all are known
        for r in range(len(merged.consumed_per_rank)):
            counts = merged.consumed_per_worker[r * workers:(r + 1) * workers]
            merged.consumed_per_rank[r] = -1 if min(counts) < 0 else sum(counts)
    return merged


def position_cursor(job, epoch, world_size, rank, worker, num_workers, consumed, sources=()):
    """The cursor of one reader: `consumed` samples of `epoch` handed out by
    (rank, worker), every other entry -1 (unknown) for merge_cursors to fill
    in from the others' cursors."""
    c = common_pb2.Cursor(job=job, epoch=epoch, world_size=world_size, sources=sources)
    workers = max(num_workers, 1)
    mine = rank * workers + worker
    c.consumed_per_rank.extend(consumed if r == rank and workers == 1 else -1
                               for r in range(max(world_size, 1)))
    if workers > 1:
        c.workers_per_rank = workers
        c.consumed_per_worker.extend(consumed if i == mine else -1
                                     for i in range(max(world_size, 1) * workers))
    return c
