"""What a Reader hands out: samples, events and its errors."""
import grpc


def core_status(error):
    """(grpc.StatusCode, message) of an error sluice._core raised, whose text
    is the C++ status's ("NOT_FOUND: job \"x\" ..."); (UNKNOWN, the whole
    text) when it names no code."""
    name, _, message = str(error).partition(": ")
    code = getattr(grpc.StatusCode, name, None)
    if not isinstance(code, grpc.StatusCode):
        return grpc.StatusCode.UNKNOWN, str(error)
    return code, message


class ReaderError(Exception):
    """A final error: unknown job, coordinator unreachable past the timeout,
    corrupt data under on_corrupt=fail, a bad resume cursor. `code` is the
    grpc.StatusCode."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class DataLossError(ReaderError):
    """A corrupt sample under on_corrupt=fail: the message names the shard and
    the member. Constructible from the message alone, so torch's DataLoader
    re-raises it as itself in the training process."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.DATA_LOSS, message)


class JobDoneError(ReaderError):
    """The job has served all its epochs: a reader that opens on it (or asks
    for an epoch past its end) gets this instead of an empty stream."""

    def __init__(self, message):
        super().__init__(grpc.StatusCode.FAILED_PRECONDITION, message)


class Sample:
    """One sample: WebDataset-style fields by name plus where it came from.

    `sample["jpg"]` is a numpy array (decoded image, HWC uint8; read-only, a
    view of the received bytes), `sample["cls"]` an int, text fields str, raw
    fields bytes. `as_dict()` gives the WebDataset dict with `__key__`,
    `__shard__`, `__index__`, and for a job with sources `__source__`.
    `source` is the source's name ("" for a job of one manifest); `shard_index`
    counts in that source's manifest.
    """
    __slots__ = ("epoch", "rank", "shard_index", "shard_url", "index", "key", "data_server",
                 "skipped", "skip_reason", "fields", "source")

    def __init__(self, epoch, rank, shard_index, shard_url, index, key, data_server, skipped,
                 skip_reason, fields, source=""):
        self.epoch, self.rank = epoch, rank
        self.shard_index, self.shard_url, self.index, self.key = shard_index, shard_url, index, key
        self.data_server, self.skipped, self.skip_reason = data_server, skipped, skip_reason
        self.fields = fields
        self.source = source

    def __getitem__(self, name):
        return self.fields[name]

    def __contains__(self, name):
        return name in self.fields

    def as_dict(self):
        d = dict(self.fields)
        d["__key__"] = self.key
        d["__shard__"] = self.shard_url
        d["__index__"] = self.index
        if self.source:
            d["__source__"] = self.source
        return d

    def __repr__(self):
        return (f"Sample(epoch={self.epoch}, rank={self.rank}, shard={self.shard_index}, "
                f"index={self.index}, key={self.key!r}, fields={sorted(self.fields)})")


class Event:
    """kind: 'sample' | 'epoch_begin' | 'epoch_end' | 'done'.

    epoch_begin: samples_for_rank / already_consumed are the rank's;
    samples_for_worker / already_consumed_by_worker this reader's slot of
    them (the same with one reader per rank). done: `message` says so."""
    __slots__ = ("kind", "epoch", "samples_for_rank", "already_consumed", "sample",
                 "samples_for_worker", "already_consumed_by_worker", "message")

    def __init__(self, kind, epoch=0, samples_for_rank=0, already_consumed=0, sample=None,
                 samples_for_worker=0, already_consumed_by_worker=0, message=""):
        self.kind, self.epoch = kind, epoch
        self.samples_for_rank, self.already_consumed, self.sample = (
            samples_for_rank, already_consumed, sample)
        self.samples_for_worker = samples_for_worker
        self.already_consumed_by_worker = already_consumed_by_worker
        self.message = message

    def __repr__(self):
        return f"Event({self.kind}, epoch={self.epoch})"
