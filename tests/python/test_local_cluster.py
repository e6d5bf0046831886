"""The local-cluster library (client/cli/local_cluster.h) through
sluice._core, as the fixtures in conftest.py use it: restarts keep a
server's flags and give it a new process, handles follow the cluster's
servers, and errors are Python's."""
import os
import signal

import pytest
from conftest import BIN, Cluster, Server, _wait_for
from sluice import _core


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("local-cluster"), shards=2, per_shard=5, data_servers=2,
                data_flags=["--decode_threads=1"])
    yield c
    c.stop()


def _live(cluster):
    return [l for l in cluster.coordinator.metric_text().splitlines()
            if l.startswith("sluice_coordinator_data_servers ")]


def test_a_restarted_data_server_is_a_new_process_with_the_same_flags(two):
    before = two.data[1]
    pid, address, argv = before.pid, before.address, before.argv
    two.restart_data_server(1)
    after = two.data[1]
    assert after.pid != pid and after.address != address
    assert after.argv == argv
    assert "--decode_threads=1" in argv
    # The old handle follows the slot: it names the new process.
    assert before.pid == after.pid
    assert _live(two) == ["sluice_coordinator_data_servers 2"]
    assert os.path.exists(after.log_path)


def _environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)


def test_servers_do_not_inherit_the_grpc_settings_sluice_made_for_this_process(two):
    import sluice
    if "GRPC_POLL_STRATEGY" not in sluice._GRPC_ENV_SET_BY_SLUICE:
        pytest.skip("GRPC_POLL_STRATEGY was set before sluice was imported")
    assert os.environ["GRPC_POLL_STRATEGY"] == "poll"  # this process polls with poll()
    two.restart_data_server(0)  # a restarted server too
    for server in (two.coordinator, two.data[0], two.data[1]):
        env = _environ(server.pid)
        assert b"GRPC_POLL_STRATEGY" not in env and b"GRPC_ENABLE_FORK_SUPPORT" not in env
        assert env[b"PATH"] == os.environ["PATH"].encode()  # the rest is inherited


def test_a_restarted_coordinator_keeps_its_address_and_takes_the_extra_flags(two):
    address, pid = two.coordinator.address, two.coordinator.pid
    two.restart_coordinator(["--heartbeat_interval=300ms"])
    assert two.coordinator.address == address and two.coordinator.pid != pid
    assert two.coordinator.argv[-1] == "--heartbeat_interval=300ms"
    # Without `extra` a restart keeps the flags it was last given.
    two.restart_coordinator()
    assert two.coordinator.argv[-1] == "--heartbeat_interval=300ms"
    _wait_for(lambda: _live(two) == ["sluice_coordinator_data_servers 2"], 30,
              "the data servers to register again")
    two.create_job("after-restarts", world_size=1)
    assert two.lease_counts("after-restarts")["granted"] == 0


def test_a_stopped_server_reports_its_exit_and_a_wait_can_time_out(tmp_path):
    server = Server("sluice-coordinator", str(tmp_path), [f"--journal_dir={tmp_path}/j"])
    assert server.poll() is None
    with pytest.raises(TimeoutError, match="still running"):
        server.wait(timeout=0.05)
    server.signal(signal.SIGKILL)
    assert server.wait(timeout=30) == 128 + signal.SIGKILL
    assert server.poll() == 128 + signal.SIGKILL


def test_a_server_that_cannot_start_raises_with_its_last_log_line(tmp_path):
    with pytest.raises(RuntimeError, match="no_such_flag"):
        Server("sluice-coordinator", str(tmp_path), ["--no_such_flag=1"])
    with pytest.raises(RuntimeError, match="cannot run"):
        _core.start_server([os.path.join(BIN, "sluice-no-such-binary")],
                           port_file=str(tmp_path / "p"), log_path=str(tmp_path / "log"))


def test_a_data_server_index_past_the_end_is_an_index_error(tmp_path):
    os.makedirs(tmp_path / "shards")
    c = _core.LocalCluster(dir=str(tmp_path), bin_dir=BIN, shards_dir=str(tmp_path / "shards"))
    try:
        c.start_coordinator()
        assert c.data_servers == []
        with pytest.raises(IndexError, match="no data server 0 of 0"):
            c.restart_data_server(0)
    finally:
        c.stop()
    assert c.coordinator.poll() is not None
