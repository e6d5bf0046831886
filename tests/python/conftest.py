"""A real local Sluice cluster for the Python client tests.

The binaries come from $SLUICE_BIN_DIR (ctest sets it to build/bin); the
client package from build/python (PYTHONPATH). Servers listen on 127.0.0.1:0
and report their ports through --port_file; every process started here is
stopped by its own PID. Jobs are created with `sluicectl` in a subprocess:
the pytest process itself never opens a gRPC channel before DataLoader
workers fork.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

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
    def __init__(self, binary, workdir, args, port=0):
        os.makedirs(workdir, exist_ok=True)
        self.port_file = os.path.join(workdir, f"{binary}-{time.monotonic_ns()}.ports")
        self.log = open(os.path.join(workdir, f"{binary}.log"), "ab")
        self.proc = subprocess.Popen(
            [os.path.join(BIN, binary), f"--listen=127.0.0.1:{port}",
             "--metrics_listen=127.0.0.1:0",
             f"--port_file={self.port_file}", *args],
            stdout=self.log, stderr=subprocess.STDOUT)

        def ports():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{binary} exited with {self.proc.returncode}")
            if not os.path.exists(self.port_file):
                return None
            lines = dict(l.split("=", 1) for l in open(self.port_file).read().split())
            return lines if "grpc" in lines else None
        p = _wait_for(ports, 30, f"{binary} to listen")
        self.address, self.metrics = p["grpc"], p["metrics"]

    def metric_text(self):
        return urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=5).read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


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
        self.coordinator_flags = [f"--journal_dir={os.path.join(self.tmp, 'journal')}",
                                  f"--heartbeat_interval={heartbeat_interval}", *server_tls,
                                  *secret,
                                  *self.admin_token, *admin, *coordinator_flags]
        self.coordinator = Server("sluice-coordinator", self.tmp, self.coordinator_flags)
        register_tls = ([f"--coordinator_ca={pki['ca.crt']}",
                         f"--coordinator_cert={pki['client.crt']}",
                         f"--coordinator_key={pki['client.key']}"] if pki else [])
        self.data = [Server("sluice-dataserver", self.tmp,
                            [f"--roots={os.path.join(self.tmp, 'shards')}",
                             f"--coordinator={self.coordinator.address}", *server_tls,
                             *register_tls, *secret, *data_flags])
                     for _ in range(data_servers)]
        _wait_for(lambda: f"sluice_coordinator_data_servers {data_servers}"
                  in self.coordinator.metric_text(), 30, "data servers to register")

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
        for s in self.data:
            s.stop()
        self.coordinator.stop()


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
