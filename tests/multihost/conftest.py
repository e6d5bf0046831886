"""A Sluice cluster over several hosts (network.py): a head running the
coordinator, data-server hosts and trainer hosts, each a network namespace
running the real binaries.

    c = HostCluster(tmp_path, data_hosts=2, trainer_hosts=2)
    c.create_job("j", world_size=2, epochs=2, mode="dynamic", lease_ttl="5s")
    readers = [c.read(c.trainers[r], "j", rank=r, epochs=2) for r in range(2)]
    c.net.cut(c.trainers[0], c.data_hosts[0])
    ranks = [r.finish(120) for r in readers]
    assert_exactly_once_and_equal(ranks, c.total, epochs=2)

Servers listen on their host's address with port 0 and report the port
through --port_file; every process is stopped by its PID (Network.close).
"""
import collections
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import importlib.util

sys.path.insert(0, os.path.dirname(__file__))
from network import Network, wait_for  # noqa: E402


def _python_fixtures():
    """tests/python/conftest.py, for its shard writer and binary path."""
    path = os.path.join(os.path.dirname(__file__), "..", "python", "conftest.py")
    spec = importlib.util.spec_from_file_location("sluice_python_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_fixtures = _python_fixtures()
BIN, write_shards = _fixtures.BIN, _fixtures.write_shards


class Node:
    """One Sluice server on a host."""

    def __init__(self, host, binary, workdir, args, port=0):
        self.host, self.binary = host, binary
        self.port_file = os.path.join(workdir, f"{binary}-{host.name}-{time.monotonic_ns()}.ports")
        with open(os.path.join(workdir, f"{binary}-{host.name}.log"), "ab") as log:
            self.proc = host.popen([os.path.join(BIN, binary), f"--listen={host.ip}:{port}",
                                    f"--metrics_listen={host.ip}:0",
                                    f"--port_file={self.port_file}", *args],
                                   stdout=log, stderr=subprocess.STDOUT)

        def ports():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{binary} on {host.name} exited with {self.proc.returncode}")
            if not os.path.exists(self.port_file):
                return None
            lines = dict(x.split("=", 1) for x in open(self.port_file).read().split())
            return lines if "grpc" in lines else None
        p = wait_for(ports, 30, f"{binary} on {host.name} to listen")
        self.address, self.metrics = p["grpc"], p["metrics"]

    def metric(self, name):
        """The sum of a metric's samples whose line starts with `name`
        (a bare name, or a name and labels), read from the server's own
        host; None when the page cannot be read."""
        text = self.host.fetch(f"http://{self.metrics}/metrics")
        if text is None:
            return None
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and not line.startswith("#"))


class Reading:
    """A trainer rank reading on a host (`sluicectl read`, the C++ Reader):
    its samples as (epoch, shard, index) in the order they arrived, with
    the monotonic time of each."""

    def __init__(self, proc):
        self.proc, self.samples, self.times, self.err = proc, [], [], []
        self._threads = [threading.Thread(target=self._out, daemon=True),
                         threading.Thread(target=self._errs, daemon=True)]
        for t in self._threads:
            t.start()

    def _out(self):
        for line in self.proc.stdout:
            d = json.loads(line)
            self.times.append(time.monotonic())
            self.samples.append((d["epoch"], d["shard"], d["index"]))

    def _errs(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def finish(self, timeout):
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        assert code == 0, "".join(self.err)[-3000:]
        return self.samples


def start_etcd(host, workdir):
    """A one-member etcd on `host`'s address; its client endpoint."""
    url = lambda port: f"http://{host.ip}:{port}"  # noqa: E731
    with open(os.path.join(workdir, "etcd.log"), "ab") as log:
        host.popen(["/usr/bin/etcd", "--name", "head", "--data-dir",
                    os.path.join(workdir, "etcd-data"), "--listen-client-urls", url(2379),
                    "--advertise-client-urls", url(2379), "--listen-peer-urls", url(2380),
                    "--initial-advertise-peer-urls", url(2380), "--initial-cluster",
                    f"head={url(2380)}"], stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: host.run(["/usr/bin/etcdctl", f"--endpoints={url(2379)}",
                               "endpoint", "health"]).returncode == 0,
             30, "etcd to serve", interval=0.2)
    return f"{host.ip}:2379"


class HostCluster:
    """`coordinators=2`: two coordinators on hosts c1 and c2 sharing a
    journal in etcd on the head (election TTL 2 s), c1 leading first;
    data servers and readers are given both. `node_local`: a data server on
    every trainer host instead of hosts of their own (the node-local
    layout). Every process knows its host by $SLUICE_NODE."""

    def __init__(self, tmp, name="cluster", data_hosts=2, trainer_hosts=2, shards=8,
                 per_shard=25, bin_repeat=50, coordinators=1, coordinator_flags=(),
                 data_flags=(), node_local=False):
        self.tmp = str(tmp)
        os.makedirs(self.tmp, exist_ok=True)
        self.net = Network(name, bin_dir=BIN)
        try:
            self.head = self.net.host("head")
            self.urls = write_shards(os.path.join(self.tmp, "shards"), shards, per_shard,
                                     bin_repeat)
            self.total = shards * per_shard
            if coordinators == 1:
                self.coordinators = [Node(self.head, "sluice-coordinator", self.tmp,
                                          [f"--journal_dir={os.path.join(self.tmp, 'journal')}",
                                           *coordinator_flags])]
            else:
                etcd = start_etcd(self.head, self.tmp)
                self.coordinator_flags = [f"--journal=etcd://{etcd}/sluice/ha",
                                          "--election_ttl=2s", *coordinator_flags]
                self.coordinators = []
                for i in range(coordinators):
                    host = self.net.host(f"c{i + 1}")
                    self.coordinators.append(self.start_coordinator(host))
                    if i == 0:
                        wait_for(lambda: self.ready(self.coordinators[0]), 30,
                                 "the first coordinator to lead", interval=0.2)
            self.trainers = [self.net.host(f"t{i + 1}") for i in range(trainer_hosts)]
            self.data_hosts = (list(self.trainers) if node_local else
                               [self.net.host(f"ds{i + 1}") for i in range(data_hosts)])
            self.data = [Node(h, "sluice-dataserver", self.tmp,
                              [f"--roots={os.path.join(self.tmp, 'shards')}",
                               f"--coordinator={self.address}", *data_flags])
                         for h in self.data_hosts]
            wait_for(lambda: self.coordinator.metric("sluice_coordinator_data_servers ")
                     == len(self.data), 30, "data servers to register")
        except BaseException:
            self.net.close()
            raise

    def start_coordinator(self, host):
        """A coordinator of the etcd-journaled pair on `host`, port 7070."""
        return Node(host, "sluice-coordinator", self.tmp, self.coordinator_flags, port=7070)

    def ready(self, node, from_host=None):
        """Whether `node` answers readiness (leads and serves), asked from
        `from_host` (default: its own host)."""
        return self.sluicectl(from_host or node.host, "health", node.address,
                              "--service=readiness", "--timeout=1s").returncode == 0

    @property
    def coordinator(self):
        return self.coordinators[0]

    @property
    def address(self):
        return ",".join(c.address for c in self.coordinators)

    def sluicectl(self, host, *args):
        return host.run([os.path.join(BIN, "sluicectl"), *args])

    def create_job(self, name, world_size=1, epochs=1, mode="dynamic", lease_ttl="5s",
                   max_samples_per_lease=10, extra=()):
        manifest = os.path.join(self.tmp, f"{name}.json")
        with open(manifest, "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in self.urls]}, f)
        got = self.sluicectl(self.head, "job", "create", f"--coordinator={self.address}",
                             f"--name={name}", f"--manifest={manifest}",
                             f"--world_size={world_size}", f"--epochs={epochs}",
                             f"--mode={mode}", f"--lease_ttl={lease_ttl}",
                             f"--max_samples_per_lease={max_samples_per_lease}", *extra)
        assert got.returncode == 0, got.stderr

    def read(self, host, job, rank=0, epochs=1, rate=0, extra=()):
        proc = host.popen([os.path.join(BIN, "sluicectl"), "read",
                           f"--coordinator={self.address}", f"--job={job}", f"--rank={rank}",
                           f"--read_epochs={epochs}", f"--rate={rate}",
                           "--progress_interval=100ms", *extra],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return Reading(proc)

    def close(self):
        self.net.close()


def assert_exactly_once_and_equal(ranks, total, epochs):
    """Every sample of every epoch delivered exactly once over the ranks,
    and every rank given the same number in each epoch (DDP's steps)."""
    seen = collections.Counter(s for samples in ranks for s in samples)
    twice = sorted(s for s, n in seen.items() if n > 1)
    assert not twice, f"{len(twice)} delivered more than once, e.g. {twice[:5]}"
    per_epoch = collections.Counter(e for e, _, _ in seen)
    assert per_epoch == {e: total for e in range(epochs)}, dict(per_epoch)
    for e in range(epochs):
        counts = [sum(1 for s in samples if s[0] == e) for samples in ranks]
        assert len(set(counts)) == 1, f"epoch {e}: per-rank counts {counts}"


@pytest.fixture
def hosts(tmp_path):
    """Makes HostClusters that are closed after the test."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    made = []

    def make(**kwargs):
        c = HostCluster(tmp_path / f"c{len(made)}", **kwargs)
        made.append(c)
        return c
    yield make
    for c in made:
        c.close()
