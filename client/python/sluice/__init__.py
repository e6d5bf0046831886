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
import os as _os

# gRPC and fork(): DataLoader workers are forked from a process that may
# already use gRPC (a Reader, len(), a helper). With fork support the child
# gets a fresh gRPC core; without it the child's streams fail or stall. Both
# must be set before grpc is first imported (an application that imports grpc
# before sluice should set them itself).
# They are this process's settings: the servers sluice._core.LocalCluster
# starts do not inherit the ones set here (a server's gRPC polls with epoll).
_GRPC_ENV_SET_BY_SLUICE = [name for name in ("GRPC_ENABLE_FORK_SUPPORT", "GRPC_POLL_STRATEGY")
                           if name not in _os.environ]
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "true")
_os.environ.setdefault("GRPC_POLL_STRATEGY", "poll")

# sluice._core carries the C++ code of the same .proto files, and with
# Debian's protobuf (the C++ implementation under Python) loading it first
# puts their C++ descriptors where a later `import sluice.v1.*_pb2` finds
# them: its messages then refuse each other's sub-messages ("expected
# sluice.v1.Manifest got sluice.v1.Manifest"). So every message module is
# imported here, before anything can load sluice._core.
from sluice.v1 import common_pb2 as _common_pb2  # noqa: F401,E402
from sluice.v1 import coordinator_pb2 as _coordinator_pb2  # noqa: F401,E402
from sluice.v1 import dataserver_pb2 as _dataserver_pb2  # noqa: F401,E402
from sluice.grpc_health.v1 import health_pb2 as _health_pb2  # noqa: F401,E402

from sluice._audit import audit, replay
from sluice.coordination import BarrierTimeout, OnceFailed, barrier, once
from sluice.reader import (DataLossError, Event, JobDoneError, Reader, ReaderError, Sample,
                           merge_cursors, tune_malloc)

__all__ = ["Reader", "Event", "Sample", "ReaderError", "DataLossError", "JobDoneError",
           "merge_cursors", "once", "barrier", "BarrierTimeout", "OnceFailed", "tune_malloc",
           "audit", "replay"]
