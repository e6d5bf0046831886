"""Which samples did a reader's loop take in an epoch, and what exactly
were they? The coordinator's audit, as `sluicectl audit` shows it, and a
sample served again, as `sluicectl replay` serves it:

    for s in sluice.audit("cifar", epoch=3, rank=5, coordinator="head:7070"):
        print(s["position"], s["key"], s["url"], s["index"])
    again = sluice.replay("cifar", 3, key="n01440764_10026", transform=train,
                          coordinator="head:7070")
    again["fields"]["jpg"]        # the tensor the trainer got, byte for byte

Each sample is a dict: position (0-based, in the reader's order), key, source
(a job with sources; "" otherwise), shard (its index in the manifest, or in
the source's), url, index (within the shard), unit (the planned unit it was
served in), unit_kind ("shard", "window" or "mixed") and reread (a run a
resume rolled back had taken it in the epoch); given the reader's
`transform`, also what its transforms drew: source_size, steps and the
flips, as replay() gives them. The coordinator
keeps a job's current epoch and the one before it. These are the C++
client's sluice::Audit and sluice::Replay (sluice/audit.h) through
sluice._core.
"""
import grpc

from sluice._types import core_status
from sluice.coordination import _address, _core, _tls

_ERRORS = {grpc.StatusCode.UNAVAILABLE: ConnectionError, grpc.StatusCode.NOT_FOUND: LookupError,
           grpc.StatusCode.FAILED_PRECONDITION: LookupError,
           grpc.StatusCode.OUT_OF_RANGE: LookupError,
           grpc.StatusCode.INVALID_ARGUMENT: ValueError}


def audit(job, epoch, *, rank=0, worker=0, start=0, count=None, step=None, batch_size=None,
          num_workers=0, rolled_back=False, keys=True, transform=None, fields=None,
          coordinator=None, timeout=10.0, ca_cert=None, client_cert=None, client_key=None):
    """The samples reader (rank, worker) of `job` acknowledged in `epoch`,
    from position `start`, at most `count` (None: all), as a list of dicts.
    Or the batch of training step `step` of the rank's loop, with
    `batch_size` samples per step and `num_workers` DataLoader workers
    (torch's DataLoader takes whole batches from the workers in turn: step
    s is batch s // K of worker s % K). rolled_back=True lists instead what
    resumes cut off the reader's record: what it read after the checkpoint
    a resume restored (samples read again after a resume have "reread").
    Keys are looked up on a live data server of the job (keys=False: not;
    they are then ""). With the `transform` (sluice.transforms.Compose) the
    reader used, each dict also has what the transforms drew for it:
    source_size (the image's width and height), steps ([{"crop": (left,
    top, width, height)} or {"resize": (width, height)}, ...] in order),
    flip_horizontal and flip_vertical, planned by a live data server from
    the image's header; give the reader's `fields` too if it chose some
    (the draws are those of the first image field among them). LookupError for an unknown job or an epoch no longer
    kept (the message names the kept ones); ValueError for a bad argument;
    ConnectionError when the coordinator cannot be reached; RuntimeError for
    any other refusal. TLS as for sluice.once()."""
    if step is not None and not batch_size:
        raise ValueError("audit: step= needs batch_size=")
    address = _address(coordinator)
    try:
        samples, _total, _missing = _core(f"audit {job}").audit(
            coordinator=address, job=job, epoch=epoch, rank=rank, worker=worker,
            **{"from": start}, count=-1 if count is None else count,
            step=-1 if step is None else step, batch_size=batch_size or 0,
            num_workers=num_workers, rolled_back=rolled_back, keys=keys,
            decode=b"" if transform is None else transform.decode_spec().SerializeToString(),
            fields=list(fields or ()), timeout=timeout, **_tls(ca_cert, client_cert, client_key))
    except RuntimeError as e:
        raise _ERRORS.get(core_status(e)[0], RuntimeError)(f"audit {job}: {e}") from None
    return samples


def replay(job, epoch, *, key=None, rank=0, worker=0, position=None, transform=None,
           decode=True, fields=None, data_server=None, coordinator=None, timeout=10.0,
           ca_cert=None, client_cert=None, client_key=None):
    """One sample of `epoch` served again with the augmentation draws it got
    then: the one with `key`, or the one at `position` of reader (rank,
    worker). Give the `transform` (sluice.transforms.Compose) the trainer's
    Reader or ShardLeaseDataset used, and its fields are the ones the
    trainer received, byte for byte; give its `fields` too if it chose
    some (only those come back, and the draws are planned as the trainer's
    were, for the first image field among them). Returns a dict: rank, worker, position,
    key, source, shard, url, index, unit, data_server, source_size (the
    image's width and height), steps ([{"crop": (left, top, width,
    height)} or {"resize": (width, height)}, ...] in order), flip_horizontal,
    flip_vertical, and fields (name -> numpy array, int, str or bytes).
    `data_server` picks the server to ask (default: the job's live ones).
    Errors as for audit()."""
    from sluice.v1 import dataserver_pb2
    if (key is None) == (position is None):
        raise ValueError("replay: give key=, or position= (with rank=, worker=)")
    spec = (transform.decode_spec() if transform is not None
            else dataserver_pb2.DecodeSpec(decode=decode))
    address = _address(coordinator)
    try:
        return _core(f"replay {job}").replay(
            coordinator=address, job=job, epoch=epoch, rank=rank, worker=worker,
            position=-1 if position is None else position, key=key or "",
            decode=spec.SerializeToString(), fields=list(fields or ()),
            data_server=data_server or "", timeout=timeout,
            **_tls(ca_cert, client_cert, client_key))
    except RuntimeError as e:
        raise _ERRORS.get(core_status(e)[0], RuntimeError)(f"replay {job}: {e}") from None
