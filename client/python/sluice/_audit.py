"""Which samples did a reader's loop take in an epoch? The coordinator's
audit, as `sluicectl audit` shows it:

    for s in sluice.audit("cifar", epoch=3, rank=5, coordinator="head:7070"):
        print(s["position"], s["key"], s["url"], s["index"])

Each sample is a dict: position (0-based, in the reader's order), key, source
(a job with sources; "" otherwise), shard (its index in the manifest, or in
the source's), url, index (within the shard), unit (the planned unit it was
served in) and unit_kind ("shard", "window" or "mixed"). The coordinator
keeps a job's current epoch and the one before it. This is the C++ client's
sluice::Audit (sluice/audit.h) through sluice._core.
"""
from sluice import _lifecycle
from sluice.coordination import _address, _tls


def audit(job, epoch, *, rank=0, worker=0, start=0, count=None, keys=True, coordinator=None,
          timeout=10.0, ca_cert=None, client_cert=None, client_key=None):
    """The samples reader (rank, worker) of `job` acknowledged in `epoch`,
    from position `start`, at most `count` (None: all), as a list of dicts.
    Keys are looked up on a live data server of the job (keys=False: not;
    they are then ""). LookupError for an unknown job or an epoch no longer
    kept (the message names the kept ones); ValueError for a bad argument;
    ConnectionError when the coordinator cannot be reached; RuntimeError for
    any other refusal. TLS as for sluice.once()."""
    from sluice import reader  # the extension, with its import error explained
    _lifecycle.check_forked_child(f"audit {job}")
    address = _address(coordinator)
    try:
        samples, _total, _missing = reader._core().audit(
            coordinator=address, job=job, epoch=epoch, rank=rank, worker=worker,
            **{"from": start}, count=-1 if count is None else count, keys=keys,
            timeout=timeout, **_tls(ca_cert, client_cert, client_key))
    except RuntimeError as e:
        code = str(e).partition(":")[0]
        error = {"UNAVAILABLE": ConnectionError, "NOT_FOUND": LookupError,
                 "FAILED_PRECONDITION": LookupError,
                 "INVALID_ARGUMENT": ValueError}.get(code, RuntimeError)
        raise error(f"audit {job}: {e}") from None
    return samples
