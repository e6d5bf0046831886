"""A data server's --max_streams_per_tenant against real readers: while one
reader of a tenant holds its stream open, another reader of the same tenant
is refused (RESOURCE_EXHAUSTED, counted by the server) and opens the stream
there again after a back-off, without a re-route; once the first goes on,
both finish and every sample arrives exactly once. Another tenant is not
held to that count."""
import collections
import re
import threading

import sluice

from conftest import Cluster, _wait_for


def refused(cluster):
    m = re.search(r'sluice_dataserver_stream_errors_total\{code="RESOURCE_EXHAUSTED"\} (\S+)',
                  cluster.data[0].metric_text())
    return float(m.group(1)) if m else 0.0


def test_a_tenant_over_its_stream_limit_waits_and_loses_nothing(tmp_path):
    # 1 MiB samples: a unit is far more than the reader and gRPC buffer, so
    # a reader that stops taking samples keeps its stream open.
    c = Cluster(tmp_path, shards=4, per_shard=20, bin_repeat=1 << 19,
                data_flags=["--max_streams_per_tenant=1"])
    try:
        c.create_job("capped", extra=["--tenant=team-a"])
        c.create_job("free", extra=["--tenant=team-b"])
        seen = collections.Counter()
        lock = threading.Lock()
        with sluice.Reader(c.address, "capped", worker=0, num_workers=2,
                           units_in_flight=1) as holder:
            first = next(iter(holder))
            seen[(first.shard_index, first.index)] += 1

            stats = {}

            def other():
                with sluice.Reader(c.address, "capped", worker=1, num_workers=2,
                                   units_in_flight=1) as reader:
                    for s in reader:
                        with lock:
                            seen[(s.shard_index, s.index)] += 1
                    stats.update(reader.stats)

            t = threading.Thread(target=other)
            t.start()
            _wait_for(lambda: refused(c) > 0, 60, "the second stream to be refused")
            # Another tenant reads beside the held stream.
            with sluice.Reader(c.address, "free", units_in_flight=1) as free:
                assert sum(1 for _ in free) == c.total
            for s in holder:
                with lock:
                    seen[(s.shard_index, s.index)] += 1
            t.join(timeout=120)
            assert not t.is_alive()
            assert holder.stats["reroutes"] == 0
        assert len(seen) == c.total and set(seen.values()) == {1}
        # Refused, waited, read from the same server: nothing re-routed.
        assert stats["reroutes"] == 0, stats
        assert refused(c) >= 1
    finally:
        c.stop()
