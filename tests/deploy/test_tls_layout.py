"""The prod overlay's TLS layout, run on this machine.

Renders k8s/overlays/prod with `kubectl kustomize` and starts the
coordinator and two data servers with the rendered containers' own
arguments: $(VARS) from the rendered ConfigMap and the downward API, every
mounted volume a local directory (the Secrets filled with certificates made
here by the openssl CLI, as an operator or cert-manager would), listeners on
127.0.0.1 port 0. Then checks what a cluster would: the kubelet's plaintext
gRPC probes at the ports the manifests name, data servers registered over
TLS, an epoch read by sluicectl and the Python Reader with the CA, and a
client without the CA told so at once.
"""
import collections
import json
import os
import subprocess
import sys

import grpc
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
from conftest import BIN, Server, _wait_for, write_shards  # noqa: E402
from rendered_pods import Pod, make_secrets, rendered  # noqa: E402

import sluice  # noqa: E402
from sluice import _core  # noqa: E402

class LocalServer(Server):
    """Server, with the listeners' flags left to the rendered arguments."""

    def __init__(self, pod, workdir, args):
        os.makedirs(workdir, exist_ok=True)
        port_file = os.path.join(workdir, "ports")
        # The rendered --metrics_listen comes after the one start_server
        # puts first, and wins.
        super().__init__(handle=_core.start_server(
            [os.path.join(BIN, pod.binary), *args], port_file=port_file,
            log_path=os.path.join(workdir, "log"), timeout=30))
        with open(port_file) as f:
            self.ports = dict(line.split("=", 1) for line in f.read().split())
        # The address the kubelet's probe at manifest port P reaches.
        by_flag = {"--listen": "grpc", "--metrics_listen": "metrics", "--health_listen": "health"}
        self.by_manifest_port = {port: self.ports[by_flag[flag]]
                                 for flag, port in pod.listen_flags.items()}


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("tls-layout"))
    objects = rendered("prod")
    secrets = make_secrets(os.path.join(tmp, "secrets"))
    datasets = os.path.join(tmp, "datasets")
    urls = write_shards(datasets, 4, 10)
    coordinator_pod = Pod(objects, "Deployment", "sluice-coordinator", "sluice-coordinator-0",
                          tmp, secrets, datasets)
    started = []
    try:
        coordinator = LocalServer(coordinator_pod, os.path.join(tmp, "coordinator"),
                                  coordinator_pod.local_args())
        started.append(coordinator)
        data_pods, data = [], []
        for i in range(2):
            pod = Pod(objects, "StatefulSet", "sluice-dataserver", f"sluice-dataserver-{i}", tmp,
                      secrets, datasets)
            data_pods.append(pod)
            server = LocalServer(pod, os.path.join(tmp, f"dataserver-{i}"),
                                 pod.local_args(coordinator.address))
            started.append(server)
            data.append(server)
        # Registered over TLS: the coordinator lists both as live.
        flags = [f"--coordinator={coordinator.address}", f"--ca_cert={secrets['ca.crt']}"]

        def live():
            out = sluicectl("status", *flags).stdout
            return out.startswith("no jobs; data servers: ") and out.count(",") == 1
        _wait_for(live, 30, "both data servers to register over TLS")
        manifest = os.path.join(tmp, "manifest.json")
        with open(manifest, "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
        yield dict(tmp=tmp, secrets=secrets, coordinator=coordinator, coordinator_pod=coordinator_pod,
                   data=data, data_pods=data_pods, manifest=manifest, total=40)
    finally:
        for s in reversed(started):
            s.stop()


def sluicectl(*args):
    return subprocess.run([os.path.join(BIN, "sluicectl"), *args], capture_output=True, text=True)


def tls_flags(layout):
    return [f"--ca_cert={layout['secrets']['ca.crt']}",
            f"--admin_token_file={layout['secrets']['sluice-admin-token']}/token"]


def test_every_listener_but_health_speaks_tls(layout):
    from sluice import tls
    for server in [layout["coordinator"], *layout["data"]]:
        assert tls.probe_transport(server.address) == "tls"
        assert tls.probe_transport(server.ports["health"]) == "plaintext"


def test_the_kubelets_plaintext_probes_see_serving(layout):
    pods = [(layout["coordinator_pod"], layout["coordinator"])] + list(
        zip(layout["data_pods"], layout["data"]))
    for pod, server in pods:
        probes = pod.probes()
        assert {name for name, _, _ in probes} >= {"livenessProbe", "readinessProbe"}
        for name, port, service in probes:
            address = server.by_manifest_port[port]
            out = sluicectl("health", address, f"--service={service}")
            assert out.returncode == 0 and "SERVING" in out.stdout, (pod.binary, name,
                                                                     out.stdout + out.stderr)


def test_data_servers_register_over_tls_and_serve_an_epoch(layout):
    flags = [f"--coordinator={layout['coordinator'].address}", *tls_flags(layout)]
    out = sluicectl("job", "create", "--name=tls-epoch", f"--manifest={layout['manifest']}",
                    *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    out = sluicectl("read", "--job=tls-epoch", *flags[:2])
    assert out.returncode == 0, out.stderr
    keys = collections.Counter(json.loads(line)["key"] for line in out.stdout.splitlines())
    assert len(keys) == layout["total"] and set(keys.values()) == {1}


def test_the_python_reader_reads_with_the_ca(layout):
    flags = [f"--coordinator={layout['coordinator'].address}", *tls_flags(layout)]
    out = sluicectl("job", "create", "--name=tls-python", f"--manifest={layout['manifest']}",
                    *flags)
    assert out.returncode == 0, out.stdout + out.stderr
    with sluice.Reader(layout["coordinator"].address, "tls-python",
                       ca_cert=layout["secrets"]["ca.crt"]) as reader:
        keys = collections.Counter(s.key for s in reader)
    assert len(keys) == layout["total"] and set(keys.values()) == {1}


def test_a_client_without_the_ca_is_told_to_use_tls(layout):
    address = layout["coordinator"].address
    out = sluicectl("job", "list", f"--coordinator={address}")
    assert out.returncode == 1, out.stdout + out.stderr
    assert (f"FAILED_PRECONDITION: job list: coordinator {address} speaks TLS, but this client "
            "connects in plaintext") in out.stderr
    out = sluicectl("read", "--job=tls-epoch", f"--coordinator={address}", "--timeout=60s")
    assert out.returncode == 1 and "speaks TLS" in out.stderr, out.stderr
    # The Reader would retry for its reconnect timeout (60 s) were the cause
    # not found: the code says it was.
    with pytest.raises(sluice.ReaderError) as error:
        with sluice.Reader(address, "tls-epoch", reconnect_timeout=60) as reader:
            next(iter(reader))
    assert error.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"coordinator {address} speaks TLS" in error.value.message
