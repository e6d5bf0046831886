"""The node-local layout across hosts: a data server on every trainer host,
each process naming its host ($SLUICE_NODE). Two trainer hosts read one
job of 8 shards x 25 samples as ranks 0 and 1."""
import signal

from conftest import assert_exactly_once_and_equal
from network import wait_for

SERVED = "sluice_dataserver_samples_served_total"
BYTES = "sluice_dataserver_bytes_served_total"


def _granted(c, locality):
    return c.coordinator.metric(
        f'sluice_coordinator_granted_samples_total{{locality="{locality}",sluice_job="j"}}')


def test_each_trainer_reads_from_the_data_server_on_its_own_node(hosts):
    c = hosts(name="local", node_local=True)
    c.create_job("j", world_size=2, epochs=2)
    readers = [c.read(c.trainers[r], "j", rank=r, epochs=2) for r in range(2)]
    ranks = [r.finish(60) for r in readers]
    assert_exactly_once_and_equal(ranks, c.total, epochs=2)
    # Every sample a trainer read came from its own node's server.
    assert [d.metric(SERVED) for d in c.data] == [len(r) for r in ranks]
    assert _granted(c, "same_node") == 2 * c.total
    assert _granted(c, "other_node") == 0
    # The data servers' count of bytes: all sent to a reader on their node.
    for d in c.data:
        assert d.metric(f'{BYTES}{{locality="same_node"}}') > 0
        assert d.metric(f'{BYTES}{{locality="other_node"}}') == 0
        assert d.metric(f'{BYTES}{{locality="unknown"}}') == 0
    status = c.sluicectl(c.head, "status", f"--coordinator={c.address}", "j")
    assert status.returncode == 0, status.stderr
    assert (f"locality: 100.0% of the samples granted are read on their trainer's node "
            f"({2 * c.total} same node, 0 other)") in status.stdout, status.stdout


def test_a_node_local_server_that_dies_moves_its_trainers_work_elsewhere(hosts):
    # t1's own data server is killed mid-epoch: t1's units fail over to the
    # server on t2's node (other_node grants), every epoch exactly once.
    c = hosts(name="localdie", node_local=True)
    c.create_job("j", world_size=2, epochs=2)
    readers = [c.read(c.trainers[r], "j", rank=r, epochs=2, rate=40) for r in range(2)]
    wait_for(lambda: len(readers[0].samples) >= 30, 30, "30 samples read")
    c.data[0].proc.send_signal(signal.SIGKILL)
    ranks = [r.finish(60) for r in readers]
    assert_exactly_once_and_equal(ranks, c.total, epochs=2)
    assert _granted(c, "other_node") > 0
    assert _granted(c, "same_node") + _granted(c, "other_node") >= 2 * c.total
    # t2's server sent t1's units across the network.
    assert c.data[1].metric(f'{BYTES}{{locality="other_node"}}') > 0
