"""Sluice's Python client.

    import sluice
    reader = sluice.Reader("head:7070", job="cifar", rank=0)
    for sample in reader:                 # one epoch after another until the job is done
        train(sample["jpg"], sample["cls"])

`sluice.Reader` mirrors the C++ sluice::Reader (client/include/sluice/reader.h):
a coordinator session with heartbeats on a background thread, several units
fetched at once and delivered in order, Progress/Complete reports, re-routing
when a data server fails, reconnecting with backoff, and an exact resume
cursor. `sluice.once` / `sluice.barrier` replace file locks and
`wait_for(exists)`. PyTorch: `sluice.torch.ShardLeaseDataset`.
"""
from sluice.coordination import BarrierTimeout, OnceFailed, barrier, once
from sluice.reader import Event, Reader, ReaderError, Sample, merge_cursors

__all__ = ["Reader", "Event", "Sample", "ReaderError", "merge_cursors", "once", "barrier",
           "BarrierTimeout", "OnceFailed"]
