"""PyTorch integration: ShardLeaseDataset, an IterableDataset over a Sluice job,
and DataLoader, torch's DataLoader that also tells the dataset which samples
the training loop consumed.

    ds = ShardLeaseDataset(coordinator="head:7070", job="imagenet", decode=True,
                           resize_shorter_side=256, crop=(224, 224))
    loader = sluice.torch.DataLoader(ds, batch_size=64, num_workers=4,
                                     persistent_workers=True)
    for epoch in range(90):
        ds.set_epoch(epoch)
        for batch in loader:          # exactly this rank's share of the epoch
            ...
            checkpoint["data"] = ds.state_dict()   # exact, also with workers

* Rank and world size come from torch.distributed when it is initialised
  (or the `rank` and `world_size` arguments); every rank gets the same
  number of samples per epoch, so DDP never hangs on an uneven last step.
* A run with another number of ranks than the job's world_size (an elastic
  torchrun that lost or gained a node) reads the job's copy for its world
  size, "<job>.w<N>", created on first use (the same data in the same order;
  reading_job names it). A checkpoint's cursor of the job or of any copy
  resumes it: the rest of the epoch is re-balanced over the new ranks.
* DataLoader workers: each worker runs its own session under the rank and
  reads a fixed slot of the rank's quota (the coordinator splits it into
  num_workers slots of equal size, give or take one sample, the same on every
  rank). A worker's pass ends when the coordinator's count for its slot is
  delivered, so it never waits on another worker and every rank yields the
  same number of batches.
* gRPC and fork: nothing here opens a channel until __iter__ runs inside
  the worker (or the main process with num_workers=0), and importing sluice
  turns on gRPC's fork support (GRPC_ENABLE_FORK_SUPPORT, poll strategy), so
  workers forked from a process that already used gRPC get a working gRPC.
  Both the "fork" and "spawn" start methods work. The exception: a process
  with a Reader open (a ShardLeaseDataset iterated with num_workers=0, a
  sluice.Reader) cannot fork workers that read, since gRPC's threads are
  busy at the fork; sluice.torch.DataLoader then starts its workers with
  "forkserver", and under torch's own DataLoader each worker fails at once
  saying so. A worker whose parent died hands its leases back and exits
  within about a second.
* One __iter__ call yields one epoch's share (the coordinator's next epoch),
  then returns; the Reader stays for the next epoch while the process lives.
  On a job that has served all its epochs, __iter__ raises JobDoneError.
* state_dict() / load_state_dict() carry the resume cursor (G7), covering
  exactly the samples the training loop took from the loader: with
  num_workers=0 from the Reader, with workers from what sluice.torch.
  DataLoader handed out (each batch is durable at the coordinator before it
  leaves its worker). With workers under torch's own DataLoader the main
  process cannot know that, and state_dict() raises. With
  torch.distributed initialised, state_dict() all-gathers the ranks'
  cursors (call it on every rank, as for a checkpoint). Resume with the
  same num_workers continues every worker exactly; another num_workers or
  world size re-balances the epoch's remaining samples.

Items are WebDataset-style dicts: decoded fields by extension (images as
uint8 HWC tensors sharing memory with the received message: do not modify
them in place), "__key__", "__shard__", "__index__", "__epoch__", and for a
job with sources "__source__" (the source's name).
"""
import collections
import logging
import multiprocessing
import multiprocessing.util
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

import grpc
import numpy as np

from sluice import _launcher, _lifecycle, tls
from sluice.reader import (JobDoneError, Reader, ReaderError, _core, _reader_error,
                           merge_cursors)
from sluice.v1 import common_pb2, coordinator_pb2

# Tensors made from received bytes are views of read-only memory.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


# Unsigned dtypes this torch has no tensor type for, widened losslessly (a
# 16-bit PNG, an npy of uint16/uint32). uint64 becomes int64 when its values
# fit.
_WIDER = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}


def _to_torch(name, value):
    if not hasattr(value, "__array_interface__"):
        return value
    wider = _WIDER.get(value.dtype)
    if wider is not None:
        value = value.astype(wider)
    elif value.dtype == np.uint64:
        # Compared as uint64 (against a Python int numpy compares in float64,
        # where 2**63 equals 2**63 - 1).
        if value.size and value.max() > np.uint64(np.iinfo(np.int64).max):
            raise ValueError(f"field {name!r}: uint64 values above 2**63 - 1 have no torch "
                             "dtype (use to_tensor=False for the numpy array)")
        value = value.astype(np.int64)
    return torch.from_numpy(value)


# The Reader of this process when it is a DataLoader worker (the tagging
# collate function reads its position after each batch).
_worker_reader = None

# Seconds between a worker's checks that its parent is alive.
_PARENT_CHECK_INTERVAL = 0.2


def _watch_parent(reader, parent):
    """Runs in a DataLoader worker: when the training process dies (the
    worker is re-parented), give the leases back and exit, instead of holding
    them for torch's own 5 s watchdog plus the lease TTL."""
    while os.getppid() == parent:
        time.sleep(_PARENT_CHECK_INTERVAL)
    try:
        reader.close()
    finally:
        os._exit(0)


class ShardLeaseDataset(IterableDataset):
    def __init__(self, coordinator, job, *, rank=None, world_size=None, decode=True,
                 resize_shorter_side=0, crop=(0, 0), transform=None, fields=(), to_tensor=True,
                 units_in_flight=4, resume_attempt=None, **reader_options):
        super().__init__()
        self.coordinator, self.job = coordinator, job
        self._rank = rank
        self._world_size = world_size
        # The job the readers open: `job`, or its copy for this run's world
        # size (_reading_job).
        self._reading = None
        self._reader_options = dict(decode=decode, resize_shorter_side=resize_shorter_side,
                                    crop=tuple(crop), transform=transform, fields=tuple(fields),
                                    units_in_flight=units_in_flight, **reader_options)
        self._to_tensor = to_tensor
        self._resume_from = None
        self._resume_attempt = resume_attempt
        # One id per restore (load_state_dict), inherited by the DataLoader's
        # workers: the coordinator tells a new restore of the same checkpoint
        # from this one's workers by it.
        self._launch_id = None
        # [epoch asked for with set_epoch (-1 = none), a worker has read]:
        # shared with the DataLoader's workers (also persistent ones, which
        # keep their own copy of everything else).
        self._shared = multiprocessing.Array("q", [-1, 0], lock=False)
        self._reader = None
        self._reader_pid = None
        self._samples_per_rank = None
        # What sluice.torch.DataLoader handed to the training loop: the
        # epoch and each worker's position in it, from the last batches.
        self._taken = None
        # An event read past the end of a pass, for the next pass.
        self._pending = None
        # Skipped corrupt samples: yielded as _Skipped markers under
        # sluice.torch.DataLoader (which sets this), else left out here.
        self._mark_skipped = False
        self._skipped = 0

    # ------------------------------------------------------------ torch API

    @property
    def rank(self):
        if self._rank is not None:
            return self._rank
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return 0

    @property
    def world_size(self):
        """The run's number of ranks: the `world_size` argument, else
        torch.distributed's when it is initialised, else None (unknown)."""
        if self._world_size is not None:
            return self._world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return None

    @property
    def reading_job(self):
        """The job this dataset's readers open: `job`, or, when the run has
        another number of ranks than the job's world_size (an elastic run
        that shrank or grew), the job's copy for this world size,
        "<job>.w<N>" (created when missing: the same data in the same order,
        and a cursor of either job resumes the other)."""
        return self._reading_job()

    def _job_query(self, timeout):
        """Arguments of the extension's job queries: this dataset's
        coordinator and the Reader's TLS settings."""
        o = self._reader_options
        files = tls.tls_settings(o.get("ca_cert"), o.get("client_cert"), o.get("client_key"))
        return dict(coordinator=self.coordinator, timeout=timeout,
                    **{k: v or "" for k, v in zip(("ca_cert", "client_cert", "client_key"),
                                                  files)})

    def _reading_job(self):
        if self._reading is not None:
            return self._reading
        world = self.world_size
        reading = self.job
        if world is not None:
            # As patient as a Reader with a coordinator that is starting or
            # failing over: the calls wait for the coordinator to be ready.
            timeout = self._reader_options.get("reconnect_timeout", 120.0)
            try:
                reading = _core().job_for_world_size(job=self.job, world_size=world,
                                                     **self._job_query(timeout))
            except RuntimeError as e:
                raise _reader_error(e) from None
            if reading != self.job:
                _log.info("sluice job %s was made for another number of ranks than this "
                          "run's %d: reading its copy %s", self.job, world, reading)
        self._reading = reading
        return reading

    def set_epoch(self, epoch):
        """Records the epoch the caller expects (workers see it too); the
        coordinator decides the order of epochs (all ranks move together), so
        a mismatch is warned about, not obeyed. An epoch past the job's end
        makes the next iteration raise JobDoneError naming it."""
        self._shared[0] = epoch

    def __len__(self):
        """Samples this rank gets per epoch (from the coordinator)."""
        if self._samples_per_rank is None:
            reading = self._reading_job()
            try:
                job = coordinator_pb2.Job.FromString(
                    _core().describe_job(job=reading, **self._job_query(30.0)))
            except RuntimeError as e:
                raise _reader_error(e) from None
            self._samples_per_rank = job.status.samples_per_rank
        return self._samples_per_rank

    @property
    def skipped(self):
        """Corrupt samples (on_corrupt=skip) left out of what this process
        handed on: with sluice.torch.DataLoader, of the batches the training
        loop took (also from workers); else of this process's own reading."""
        return self._skipped

    def _note_skipped(self, key, shard, index, reason):
        self._skipped += 1
        if self._skipped <= _SKIPPED_LOGGED:
            _log.warning("sluice job %s: skipped corrupt sample %r (shard %s, index %d): %s%s",
                         self.job, key, shard, index, reason,
                         "; further skips are counted in ds.skipped" if
                         self._skipped == _SKIPPED_LOGGED else "")

    def __iter__(self):
        reader = self._get_reader()
        if get_worker_info() is not None:
            self._shared[1] = 1
        # One pass = this reader's slot of one epoch: it ends when the
        # coordinator's count for the slot has been delivered.
        epoch, left = None, None
        while True:
            if self._pending is not None:
                e, self._pending = self._pending, None
            else:
                e = reader.next_event()
            if e.kind == "epoch_begin":
                asked = self._shared[0]
                if epoch is None and 0 <= asked < e.epoch:
                    # set_epoch() names an epoch that is already over (a
                    # checkpoint taken at its last batch): this pass yields
                    # nothing, and the next one starts with e.epoch.
                    self._pending = e
                    return
                epoch, left = e.epoch, e.samples_for_worker - e.already_consumed_by_worker
                self._samples_per_rank = e.samples_for_rank
                if asked >= 0 and asked != e.epoch:
                    warnings.warn(f"sluice job {self.job}: set_epoch({asked}) but the "
                                  f"coordinator's next epoch is {e.epoch}")
                if left <= 0:
                    return
            elif e.kind == "sample" and e.sample.skipped:
                s = e.sample
                left -= 1
                if self._mark_skipped:
                    # sluice.torch.DataLoader's collate leaves it out of its
                    # batch (the batch count per rank stays the same).
                    yield _Skipped(s.key, s.shard_url, s.index, s.skip_reason)
                else:
                    self._note_skipped(s.key, s.shard_url, s.index, s.skip_reason)
                if left == 0:
                    return
            elif e.kind == "sample":
                s = e.sample
                item = {k: (_to_torch(k, v) if self._to_tensor else v)
                        for k, v in s.fields.items()}
                item["__key__"] = s.key
                item["__shard__"] = s.shard_url
                item["__index__"] = s.index
                item["__epoch__"] = s.epoch
                if s.source:
                    item["__source__"] = s.source
                left -= 1
                yield item
                if left == 0:
                    return
            elif e.kind == "epoch_end":
                if e.epoch == epoch:  # the job's epoch ended with the pass unfinished
                    return
                # else: the end of an epoch whose pass this reader finished
            else:  # done
                if epoch is None:  # no epoch began for this pass
                    asked = self._shared[0]
                    self._pending = e  # every later pass ends here too
                    if 0 <= asked < e.epoch:
                        return  # the epoch asked for is over (a resume after it)
                    raise JobDoneError(e.message + (f" (set_epoch({asked}) asked for one more)"
                                                    if asked >= 0 else ""))
                return

    def state_dict(self):
        """{"cursor": serialized sluice.v1.Cursor} after exactly the samples
        the training loop took: every rank's counts when torch.distributed
        is initialised (all-gathered), else this rank's."""
        if self._reader is not None and self._reader_pid == os.getpid():
            try:
                cursor = self._reader.cursor()
            except ReaderError as e:
                # No epoch began since the restore (it was taken after the
                # job's last sample): the restored position still holds.
                if e.code != grpc.StatusCode.FAILED_PRECONDITION or self._resume_from is None:
                    raise
                cursor = self._resume_from
        elif self._taken is not None:
            cursor = self._cursor_from_taken()
        elif self._resume_from is not None:
            cursor = self._resume_from  # nothing taken since the restore
        elif self._shared[1]:
            raise RuntimeError(
                f"sluice job {self.job}: ShardLeaseDataset.state_dict() cannot see what the "
                "training loop consumed: the samples were read in DataLoader workers. Iterate "
                "through sluice.torch.DataLoader (the same arguments as torch's) instead")
        else:
            cursor = self._resume_from
        if cursor is None:
            return {"cursor": b""}
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, cursor.SerializeToString())
            cursor = merge_cursors(common_pb2.Cursor.FromString(g) for g in gathered)
        return {"cursor": cursor.SerializeToString()}

    def load_state_dict(self, state):
        """Resume from a state_dict(): the next reader starts right after it.
        Each call is a restore of its own: loading the same checkpoint again
        (in this process or a later launch) restores the same position again,
        and the other ranks of this restart join it without passing anything
        (protos/README.md, "Resuming")."""
        data = state.get("cursor", b"")
        self._resume_from = common_pb2.Cursor.FromString(data) if data else None
        self._launch_id = _launcher.new_launch_id()
        self._taken = None
        if self._reader is not None and self._reader_pid == os.getpid():
            # A Reader of this process serves the position being replaced.
            self._reader.close()
            self._reader = None

    # ------------------------------------------------------------ internals

    def _take(self, where):
        """Records a batch handed to the training loop (sluice.torch.DataLoader):
        `where` is its worker's cursor right after the batch."""
        cursor = common_pb2.Cursor.FromString(where)
        if self._taken is None or self._taken[0].epoch != cursor.epoch:
            self._taken = (cursor, {})
        workers = max(cursor.workers_per_rank, 1)
        counts = cursor.consumed_per_worker if workers > 1 else cursor.consumed_per_rank
        for slot, n in enumerate(counts):
            if n >= 0:
                self._taken[1][slot] = n

    def _cursor_from_taken(self):
        template, positions = self._taken
        workers = max(template.workers_per_rank, 1)
        c = common_pb2.Cursor(job=template.job, epoch=template.epoch,
                              world_size=template.world_size,
                              workers_per_rank=template.workers_per_rank)
        ranks = max(template.world_size, 1)
        # A worker that has handed out nothing of this epoch yet is where the
        # epoch began for it: the resume point, if the run resumed into it.
        start = {}
        r = self._resume_from
        if (r is not None and r.job == template.job and r.epoch == template.epoch and
                max(r.workers_per_rank, 1) == workers and r.world_size == template.world_size):
            start = dict(enumerate(r.consumed_per_worker if workers > 1 else r.consumed_per_rank))
        rank = self.rank
        counts = [positions.get(i, start.get(i, 0)) if i // workers == rank else -1
                  for i in range(ranks * workers)]
        if workers > 1:
            c.consumed_per_worker.extend(counts)
            c.consumed_per_rank.extend(sum(counts[q * workers:(q + 1) * workers])
                                       if q == rank else -1 for q in range(ranks))
        else:
            c.consumed_per_rank.extend(counts)
        return c

    def _get_reader(self):
        global _worker_reader
        if self._reader is not None and self._reader_pid == os.getpid():
            return self._reader
        info = get_worker_info()
        worker = info.id if info is not None else 0
        num_workers = info.num_workers if info is not None else 0
        self._reader = Reader(self.coordinator, self._reading_job(), self.rank, worker,
                              num_workers=num_workers, resume_from=self._resume_from,
                              resume_attempt=self._resume_attempt,
                              launch_id=self._launch_id, **self._reader_options)
        self._reader_pid = os.getpid()
        # Give leases back when a DataLoader worker process exits.
        multiprocessing.util.Finalize(self._reader, self._reader.close, exitpriority=10)
        if info is not None:
            _worker_reader = self._reader
            threading.Thread(target=_watch_parent, args=(self._reader, os.getppid()),
                             daemon=True, name="sluice-parent-watch").start()
        return self._reader

    def close(self):
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
            self._reader = None

    def __getstate__(self):
        state = self.__dict__.copy()
        # Workers read under the parent's rank and world size, also when
        # started with "spawn" (where torch.distributed is not set up).
        state["_rank"] = self.rank
        state["_world_size"] = self.world_size
        state["_reader"] = None  # never pickled into spawned workers
        state["_reader_pid"] = None
        state["_taken"] = None
        state["_pending"] = None
        return state


# A corrupt sample left out under on_corrupt=skip, on its way to the collate.
_Skipped = collections.namedtuple("_Skipped", ["key", "shard", "index", "reason"])

# How many skipped samples are logged by key (all are counted).
_SKIPPED_LOGGED = 5

_log = logging.getLogger("sluice")

_Tagged = collections.namedtuple("_Tagged", ["data", "where", "skipped"])


class _TaggingCollate:
    """The user's collate function, run in the worker, over the batch's good
    samples, plus where the batch ends (the worker's cursor after its last
    sample, durable at the coordinator before the batch leaves the worker)
    and the corrupt samples left out of it. A batch may so be smaller, never
    missing: every rank still takes the same number of batches."""

    def __init__(self, collate_fn, batched):
        self.collate_fn = collate_fn
        self.batched = batched

    def __call__(self, batch):
        if self.batched:
            skipped = [b for b in batch if isinstance(b, _Skipped)]
            kept = [b for b in batch if not isinstance(b, _Skipped)] if skipped else batch
        else:
            skipped = [batch] if isinstance(batch, _Skipped) else []
            kept = None if skipped else batch
        data = self.collate_fn(kept) if kept or not self.batched and not skipped else None
        reader = _worker_reader
        if reader is None or reader._pid != os.getpid():
            # num_workers=0: the dataset's own Reader knows
            return _Tagged(data, b"", skipped)
        return _Tagged(data, reader.cursor().SerializeToString(), skipped)


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader over a ShardLeaseDataset (keyword
    arguments as torch's) that tells the dataset which batches the training
    loop took, so that ShardLeaseDataset.state_dict() is exact with workers
    (batches prefetched into the loader's queues are not counted)."""

    def __init__(self, dataset, **kwargs):
        if not isinstance(dataset, ShardLeaseDataset):
            raise TypeError("sluice.torch.DataLoader reads a ShardLeaseDataset; got "
                            f"{type(dataset).__name__}")
        collate_fn = kwargs.pop("collate_fn", None)
        batched = kwargs.get("batch_size", 1) is not None or "batch_sampler" in kwargs
        if collate_fn is None:
            collate_fn = (torch.utils.data.default_collate if batched
                          else torch.utils.data.default_convert)
        dataset._mark_skipped = True
        # Workers forked while this process has a Reader open could not
        # read (gRPC cannot start in them): unless told otherwise, they are
        # then started with forkserver.
        self._context_given = kwargs.get("multiprocessing_context") is not None
        super().__init__(dataset, collate_fn=_TaggingCollate(collate_fn, batched), **kwargs)

    def __iter__(self):
        if (self.num_workers > 0 and not self._context_given and
                self.multiprocessing_context is None and _lifecycle.has_open_readers()):
            _log.info("sluice: this process has a Reader open; DataLoader workers start "
                      "with 'forkserver' instead of fork")
            self.multiprocessing_context = "forkserver"
        for tagged in super().__iter__():
            if tagged.where:
                self.dataset._take(tagged.where)
            for s in tagged.skipped:
                self.dataset._note_skipped(*s)
            if tagged.data is None:
                # Every sample of this batch was corrupt: there is nothing to
                # train on, and this rank takes one batch fewer.
                _log.warning("sluice job %s: a batch of %d corrupt samples left out",
                             self.dataset.job, len(tagged.skipped))
                continue
            yield tagged.data
