"""A real local Sluice cluster for the Python client tests.

The binaries come from $SLUICE_BIN_DIR (ctest sets it to build/bin); the
client package from build/python (PYTHONPATH). Servers are started by the
local-cluster library `sluicectl up` runs on (client/cli/local_cluster.h,
through sluice._core): they listen on 127.0.0.1:0 and report their ports
through --port_file, and every process started here is stopped by its own
PID. Jobs are created with `sluicectl` in a subprocess.
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from sluice import _core

# sample_data.py sits beside this file, which other suites load by its path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sample_data import write_tars  # noqa: E402

BIN = os.environ.get("SLUICE_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                     "build", "bin"))


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling with a deadline
    raise TimeoutError(f"timed out waiting for {what}")


def write_shards(directory, shards, per_shard, bin_repeat=50):
    """WebDataset tars: key s{S}_{I} with .cls (the index) and .bin fields
    (2 * bin_repeat bytes)."""
    return write_tars(
        directory, shards, per_shard,
        lambda s, i: (f"s{s}_{i}", [("cls", str(i).encode()),
                                    ("bin", bytes([s, i % 256]) * bin_repeat)]),
        "shard")


def start_etcd(directory):
    """A one-member etcd on a loopback port of its choosing; (process,
    endpoint)."""
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(directory, "etcd.log")
    log = open(log_path, "wb")
    any_url = "http://127.0.0.1:0"
    proc = subprocess.Popen(
        ["/usr/bin/etcd", "--name", "test", "--data-dir", os.path.join(directory, "data"),
         "--listen-client-urls", any_url, "--advertise-client-urls", any_url,
         "--listen-peer-urls", any_url, "--initial-advertise-peer-urls", any_url,
         "--initial-cluster", "test=" + any_url, "--log-outputs", "stderr"],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    serving = re.compile(rb"serving (?:insecure )?client requests on (127\.0\.0\.1:[0-9]+)")

    def endpoint():
        assert proc.poll() is None, open(log_path, "rb").read()[-2000:]
        m = serving.search(open(log_path, "rb").read())
        return m and m.group(1).decode()
    return proc, _wait_for(endpoint, 30, "etcd to serve")


def ready(address):
    return subprocess.run([os.path.join(BIN, "sluicectl"), "health",
                           address, "--service=readiness", "--timeout=2s"],
                          capture_output=True).returncode == 0


def free_port():
    """A loopback port nobody listens on now (for a server that must come
    back on the same port after a restart)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process started by the local-cluster library
    (client/cli/local_cluster.h, through sluice._core): alone (`binary` in
    $SLUICE_BIN_DIR with `args`, listening on 127.0.0.1:`port`, its output in
    WORKDIR/BINARY.log), or, given `handle`, one of a Cluster's."""

    def __init__(self, binary=None, workdir=None, args=(), port=0, handle=None):
        if handle is None:
            os.makedirs(workdir, exist_ok=True)
            handle = _core.start_server(
                [os.path.join(BIN, binary), f"--listen=127.0.0.1:{port}", *args],
                port_file=os.path.join(workdir, f"{binary}-{time.monotonic_ns()}.ports"),
                log_path=os.path.join(workdir, f"{binary}.log"), timeout=30)
        self._handle = handle

    @property
    def address(self):
        return self._handle.address

    @property
    def metrics(self):
        return self._handle.metrics

    @property
    def pid(self):
        return self._handle.pid

    @property
    def log_path(self):
        return self._handle.log_path

    @property
    def argv(self):
        """The command as started (without the flags start_server puts first)."""
        return self._handle.argv

    def signal(self, signo):
        self._handle.signal(signo)

    def poll(self):
        return self._handle.poll()

    def wait(self, timeout=None):
        return self._handle.wait(timeout)

    def kill(self):
        self._handle.kill()

    def metric_text(self):
        return urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5).read().decode()

    def stop(self):
        """SIGTERM, then SIGKILL after 30 s; waits for the exit."""
        self._handle.stop(30.0)


def make_pki(directory):
    """A throwaway CA, a server certificate for 127.0.0.1 and a client
    certificate, made with the openssl CLI. Returns {name: path}."""
    os.makedirs(directory, exist_ok=True)
    d = lambda name: os.path.join(directory, name)  # noqa: E731
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", d("ca.key"), "-out", d("ca.crt"),
                    "-days", "2", "-subj", "/CN=sluice-test-ca"], check=True, capture_output=True)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth"),
                      ("trainer", "extendedKeyUsage=clientAuth")):
        with open(d(f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        subprocess.run(["openssl", "req", "-new", *ec, "-keyout", d(f"{name}.key"), "-out",
                        d(f"{name}.csr"), "-subj", f"/CN={name}"], check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", d(f"{name}.csr"), "-CA", d("ca.crt"),
                        "-CAkey", d("ca.key"), "-CAcreateserial", "-days", "2", "-out",
                        d(f"{name}.crt"), "-extfile", d(f"{name}.ext")],
                       check=True, capture_output=True)
    return {n: d(n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key",
                              "trainer.crt", "trainer.key")}


class Cluster:
    def __init__(self, tmp, shards=6, per_shard=17, data_servers=1, pki=None, bin_repeat=50,
                 lease_secret=False, heartbeat_interval="200ms", data_flags=(),
                 coordinator_flags=()):
        self.tmp = str(tmp)
        self.urls = write_shards(os.path.join(self.tmp, "shards"), shards, per_shard, bin_repeat)
        self.total = shards * per_shard
        # With `pki`: both servers listen with TLS and demand client
        # certificates; data servers register with the client certificate,
        # which is also the operator's (CN=client); CN=trainer is neither.
        self.pki = pki
        server_tls = ([f"--tls_cert={pki['server.crt']}", f"--tls_key={pki['server.key']}",
                       f"--tls_client_ca={pki['ca.crt']}"] if pki else [])
        self.client_tls = ([f"--ca_cert={pki['ca.crt']}", f"--client_cert={pki['client.crt']}",
                            f"--client_key={pki['client.key']}"] if pki else [])
        # With `lease_secret`: leases carry tokens, and data servers check
        # them and their fences.
        # A secured coordinator needs an operator credential for CreateJob:
        # with a lease secret, a token in admin.token (sent by create_job).
        secret = []
        self.admin_token = []
        self.admin_metadata = ()
        if lease_secret:
            path = os.path.join(self.tmp, "lease.secret")
            token = os.path.join(self.tmp, "admin.token")
            for p in (path, token):
                with open(p, "w") as f:
                    f.write(os.urandom(16).hex())
                os.chmod(p, 0o600)
            secret = [f"--lease_secret_file={path}"]
            self.admin_token = [f"--admin_token_file={token}"]
            with open(token) as f:
                self.admin_metadata = (("authorization", "Bearer " + f.read()),)
        admin = ["--admin_identities=client", "--data_server_identities=client"] if pki else []
        register_tls = ([f"--coordinator_ca={pki['ca.crt']}",
                         f"--coordinator_cert={pki['client.crt']}",
                         f"--coordinator_key={pki['client.key']}"] if pki else [])
        tls = ({"ca_cert": pki["ca.crt"], "client_cert": pki["client.crt"],
                "client_key": pki["client.key"]} if pki else {})
        self._cluster = _core.LocalCluster(
            dir=self.tmp, bin_dir=BIN, shards_dir=os.path.join(self.tmp, "shards"),
            coordinator_flags=[f"--heartbeat_interval={heartbeat_interval}", *server_tls,
                               *secret, *self.admin_token, *admin, *coordinator_flags],
            data_server_flags=[*server_tls, *register_tls, *secret, *data_flags], **tls)
        self._cluster.start_coordinator()
        self._cluster.start_data_servers(data_servers)

    @property
    def coordinator(self):
        return Server(handle=self._cluster.coordinator)

    @property
    def data(self):
        """The data servers, in the order they were started."""
        return [Server(handle=h) for h in self._cluster.data_servers]

    def start_data_servers(self, n, flags=()):
        """Starts `n` more data servers, with `flags` after the cluster's, and
        waits until the coordinator counts every data server live."""
        self._cluster.start_data_servers(n, list(flags))

    def restart_coordinator(self, extra=None):
        """Kills the coordinator unless it is down and starts it again on its
        address and journal (`extra`: flags to start it with instead of the
        ones it has); waits until it is ready."""
        self._cluster.restart_coordinator(extra)

    def restart_data_server(self, i):
        """Stops data server `i` unless it is down and starts it again with
        the same flags (a new process on a new port); waits until the
        coordinator counts every data server live again."""
        self._cluster.restart_data_server(i)
        self._cluster.start_data_servers(0)

    @property
    def address(self):
        return self.coordinator.address

    def create_job(self, name, world_size=1, epochs=1, mode="static", seed=7, shuffle=True,
                   lease_ttl="2s", max_samples_per_lease=0, extra_shards=(), shuffle_window=0,
                   shards=None, extra=()):
        """`shards` ([(url, num_samples)]) replaces the cluster's shards;
        `extra` are more `sluicectl job create` flags."""
        manifest = os.path.join(self.tmp, f"{name}.json")
        urls = list(self.urls) if shards is None else list(shards)
        with open(manifest, "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n}
                                  for u, n in urls + list(extra_shards)]}, f)
        args = [os.path.join(BIN, "sluicectl"), "job", "create", f"--coordinator={self.address}",
                f"--name={name}", f"--manifest={manifest}", f"--world_size={world_size}",
                f"--epochs={epochs}", f"--mode={mode}", f"--seed={seed}",
                "--shuffle" if shuffle else "--noshuffle", f"--lease_ttl={lease_ttl}",
                *self.client_tls, *self.admin_token]
        if max_samples_per_lease:
            args.append(f"--max_samples_per_lease={max_samples_per_lease}")
        if shuffle_window:
            args.append(f"--shuffle_window={shuffle_window}")
        args.extend(extra)
        out = subprocess.run(args, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr

    def lease_counts(self, job):
        """The job's LeaseCounts (granted, completed, expired, returned) as a
        dict, from `sluicectl status --json`."""
        out = subprocess.run([os.path.join(BIN, "sluicectl"), "status", "--json",
                              f"--coordinator={self.address}", *self.client_tls, job],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        leases = json.loads(out.stdout)["status"].get("leases", {})
        return {k: int(leases.get(k, 0)) for k in ("granted", "completed", "expired", "returned")}

    def stop(self):
        self._cluster.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """6 shards x 17 samples, one data server; each test uses its own job."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cluster100(tmp_path_factory):
    """5 shards x 20 samples (100: not divisible by 3), one data server."""
    c = Cluster(tmp_path_factory.mktemp("cluster100"), shards=5, per_shard=20)
    yield c
    c.stop()
