"""Jobs across hosts under network partitions (silent drops on the bridge,
network.py): every epoch delivered exactly once, equal per-rank counts,
and a finish within a stated bound.

Each test: a head (coordinator), two data-server hosts, two trainer hosts
reading one dynamic job of 8 shards x 25 samples as ranks 0 and 1 at a
paced rate (`sluicectl read --rate`, a training step), lease TTL 5 s.
"""
import re
import time

import pytest

from conftest import assert_exactly_once_and_equal
from network import wait_for

TTL = 5.0


def _gaps(reading):
    times = reading.times
    return [b - a for a, b in zip(times, times[1:])] or [0.0]


def _rerouted(reading):
    """The units a `sluicectl read` re-routed (its closing line)."""
    last = "".join(reading.err).strip().splitlines()[-1]
    m = re.search(r"(\d+) re-routed", last)
    assert m, last
    return int(m.group(1))


def test_a_trainer_cut_from_one_data_server_reads_from_the_other(hosts):
    # Trainer host t1 loses data server ds1 mid-epoch; t2 still reaches both.
    # The units t1 held on ds1 fail (keepalive, or the connect) and are
    # re-routed, and the coordinator routes no more of t1's units to ds1
    # while t2's still go there: t1 re-routes only what it held at the cut.
    c = hosts(name="trds")
    c.create_job("j", world_size=2, epochs=4, extra=["--noshuffle"])
    readers = [c.read(c.trainers[r], "j", rank=r, epochs=4, rate=40) for r in range(2)]
    wait_for(lambda: len(readers[0].samples) >= 30, 30, "30 samples read")
    c.net.cut(c.trainers[0], c.data_hosts[0])
    served_at_cut = c.data[0].metric("sluice_dataserver_samples_served_total")
    ranks = [r.finish(120) for r in readers]
    assert_exactly_once_and_equal(ranks, c.total, epochs=4)
    assert _rerouted(readers[0]) <= 4
    assert _rerouted(readers[1]) == 0
    # t2 kept reading from ds1 after the cut.
    assert c.data[0].metric("sluice_dataserver_samples_served_total") > served_at_cut
    # Each reader's longest wait for a sample: t1's is the failover's.
    assert max(_gaps(readers[0])) < 10
