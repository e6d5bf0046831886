"""PyTorch integration: ShardLeaseDataset, an IterableDataset over a Sluice job.

    ds = ShardLeaseDataset(coordinator="head:7070", job="imagenet", decode=True,
                           resize_shorter_side=256, crop=(224, 224))
    loader = torch.utils.data.DataLoader(ds, batch_size=64, num_workers=4)
    for epoch in range(90):
        ds.set_epoch(epoch)
        for batch in loader:          # exactly this rank's share of the epoch
            ...

* Rank and world size come from torch.distributed when it is initialised
  (or the `rank` argument); every rank gets the same number of samples per
  epoch, so DDP never hangs on an uneven last step.
* DataLoader workers: each worker runs its own session under the rank
  (worker = get_worker_info().id) and the workers share the rank's quota.
* gRPC and fork: nothing here opens a channel until __iter__ runs inside
  the worker (or the main process with num_workers=0), and importing sluice
  turns on gRPC's fork support (GRPC_ENABLE_FORK_SUPPORT, poll strategy), so
  workers forked from a process that already used gRPC get a working gRPC.
  Both the "fork" and "spawn" start methods work.
* One __iter__ call yields one epoch (the coordinator's next one), then
  returns; the Reader stays for the next epoch while the process lives.
* state_dict() / load_state_dict() carry the resume cursor (G7). With
  torch.distributed initialised, state_dict() all-gathers the ranks' cursors
  (call it on every rank, as for a checkpoint). Exact with num_workers=0 (one
  reader per rank); with workers, each worker's reader reports separately.

Items are WebDataset-style dicts: decoded fields by extension (images as
uint8 HWC tensors sharing memory with the received message: do not modify
them in place), "__key__", "__shard__", "__index__", "__epoch__".
"""
import multiprocessing.util
import os
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

import numpy as np

from sluice import tls
from sluice.reader import Reader, merge_cursors
from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc

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


class ShardLeaseDataset(IterableDataset):
    def __init__(self, coordinator, job, *, rank=None, decode=True, resize_shorter_side=0,
                 crop=(0, 0), fields=(), to_tensor=True, units_in_flight=4,
                 resume_attempt=None, **reader_options):
        super().__init__()
        self.coordinator, self.job = coordinator, job
        self._rank = rank
        self._reader_options = dict(decode=decode, resize_shorter_side=resize_shorter_side,
                                    crop=tuple(crop), fields=tuple(fields),
                                    units_in_flight=units_in_flight, **reader_options)
        self._to_tensor = to_tensor
        self._resume_from = None
        self._resume_attempt = resume_attempt
        self._epoch = None
        self._reader = None
        self._reader_pid = None
        self._samples_per_rank = None
        self._ended_epoch = None

    # ------------------------------------------------------------ torch API

    @property
    def rank(self):
        if self._rank is not None:
            return self._rank
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
        return 0

    def set_epoch(self, epoch):
        """Records the epoch the caller expects; the coordinator decides the
        order of epochs (all ranks move together), so a mismatch is warned
        about, not obeyed."""
        self._epoch = epoch

    def __len__(self):
        """Samples this rank gets per epoch (from the coordinator)."""
        if self._samples_per_rank is None:
            o = self._reader_options  # the Reader's TLS settings
            credentials = o.get("credentials") or tls.channel_credentials(
                o.get("ca_cert"), o.get("client_cert"), o.get("client_key"))
            with tls.channel(self.coordinator, credentials) as channel:
                job = coordinator_pb2_grpc.CoordinatorStub(channel).GetJob(
                    coordinator_pb2.GetJobRequest(name=self.job), timeout=30)
            self._samples_per_rank = job.status.samples_per_rank
        return self._samples_per_rank

    def __iter__(self):
        reader = self._get_reader()
        info = get_worker_info()
        # With several workers, the DataLoader asks them in turn: a worker
        # with nothing left must end its part of the epoch, not wait for the
        # others (who would wait for it).
        several = info is not None and info.num_workers > 1
        # After ending an epoch early, wait for the next one to begin before
        # "nothing left" can mean this epoch again.
        in_new_epoch = self._ended_epoch is None
        while True:
            e = reader.next_event(stop_when_starved=several and in_new_epoch)
            if e.kind == "starved":
                # Work that comes back later (an expired lease) still reaches
                # this reader; it is yielded at the start of the next pass.
                self._ended_epoch = e.epoch
                return
            if e.kind == "epoch_end" and e.epoch == self._ended_epoch:
                continue  # this worker's part of that epoch already ended
            if e.kind == "epoch_begin":
                in_new_epoch = True
                self._samples_per_rank = e.samples_for_rank
                if self._epoch is not None and self._epoch != e.epoch:
                    warnings.warn(f"sluice job {self.job}: set_epoch({self._epoch}) but the "
                                  f"coordinator's next epoch is {e.epoch}")
            elif e.kind == "sample":
                s = e.sample
                item = {k: (_to_torch(k, v) if self._to_tensor else v)
                        for k, v in s.fields.items()}
                item["__key__"] = s.key
                item["__shard__"] = s.shard_url
                item["__index__"] = s.index
                item["__epoch__"] = s.epoch
                yield item
            else:  # epoch_end or done
                return

    def state_dict(self):
        """{"cursor": serialized sluice.v1.Cursor}: every rank's count when
        torch.distributed is initialised (all-gathered), else this rank's."""
        if self._reader is None or self._reader_pid != os.getpid():
            cursor = self._resume_from
        else:
            cursor = self._reader.cursor()
        if cursor is None:
            return {"cursor": b""}
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, cursor.SerializeToString())
            cursor = merge_cursors(common_pb2.Cursor.FromString(g) for g in gathered)
        return {"cursor": cursor.SerializeToString()}

    def load_state_dict(self, state):
        """Resume from a state_dict(): the next reader starts right after it.
        Every rank of one restart must use the same resume_attempt (default:
        torchrun's TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT)."""
        data = state.get("cursor", b"")
        self._resume_from = common_pb2.Cursor.FromString(data) if data else None

    # ------------------------------------------------------------ internals

    def _get_reader(self):
        if self._reader is not None and self._reader_pid == os.getpid():
            return self._reader
        info = get_worker_info()
        worker = info.id if info is not None else 0
        attempt = self._resume_attempt
        if attempt is None:
            attempt = (f"{os.environ.get('TORCHELASTIC_RUN_ID', '')}-"
                       f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '')}")
        self._reader = Reader(self.coordinator, self.job, self.rank, worker,
                              resume_from=self._resume_from, resume_attempt=attempt,
                              **self._reader_options)
        self._reader_pid = os.getpid()
        # Give leases back when a DataLoader worker process exits.
        multiprocessing.util.Finalize(self._reader, self._reader.close, exitpriority=10)
        return self._reader

    def close(self):
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
            self._reader = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None  # never pickled into spawned workers
        state["_reader_pid"] = None
        return state
