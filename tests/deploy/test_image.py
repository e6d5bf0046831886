"""The container image (k8s/image/Dockerfile, built by `make image`) run as
the manifests run it.

The coordinator and two data servers run as podman containers with the dev
overlay's rendered arguments, as UID 10001 with a read-only root file
system, no capabilities, and each of the manifest's volumes mounted where
the manifest mounts it (host directories standing in for the Secrets, the
journal claim, the datasets claim and the emptyDirs, with the ownership
fsGroup 10001 gives them). Containers share the host's network, so
listeners move to 127.0.0.1 port 0 and are read back from --port_file.
Checks the probes the manifests declare, reads an epoch with sluicectl from
outside, and stops a data server with the manifest's grace period: drained,
exit 0.

  SLUICE_IMAGE=sluice:dev (default) SLUICE_BIN_DIR=build/bin pytest tests/deploy/test_image.py
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
sys.path.insert(0, os.path.dirname(__file__))
from conftest import BIN, _wait_for, write_shards  # noqa: E402
from rendered_pods import ROOT, Pod, make_secrets, rendered  # noqa: E402

IMAGE = os.environ.get("SLUICE_IMAGE", "sluice:dev")
UID = 10001
ENV = dict(os.environ, CONTAINERS_CONF=os.path.join(ROOT, "k8s", "image", "containers.conf"))


def podman(*args, check=True):
    out = subprocess.run(["podman", *args], capture_output=True, text=True, env=ENV)
    if check and out.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {out.stderr}")
    return out


def own(path, mode, uid=0, gid=UID):
    os.chown(path, uid, gid)
    os.chmod(path, mode)


class Container:
    """One rendered workload's container under podman."""

    def __init__(self, pod, name, coordinator=None):
        self.pod = pod
        # A writable mount for the port file (the journal, or /tmp).
        writable = next(m for m in sorted(pod.mounts) if not pod.read_only[m] and
                        m not in pod.secret_mounts)
        self.port_file = os.path.join(pod.mounts[writable], "ports")
        args = [f"--port_file={writable}/ports"]
        for arg in pod.args:
            flag, _, value = arg.partition("=")
            if flag in ("--listen", "--metrics_listen", "--health_listen"):
                pod.listen_flags[flag] = int(value.rsplit(":", 1)[1])
                args.append(f"{flag}=127.0.0.1:0")
            elif flag == "--coordinator":
                args.append(f"--coordinator={coordinator}")
            elif flag != "--advertise":  # a pod DNS name: the bound address here
                args.append(arg)
        volumes = []
        for mount, local in pod.mounts.items():
            volumes += ["-v", f"{local}:{mount}" + (":ro" if pod.read_only[mount] else "")]
        self.id = podman("run", "-d", "--name", name, "--user", f"{UID}:{UID}", "--read-only",
                         "--cap-drop=ALL", "--security-opt=no-new-privileges",
                         "--entrypoint", pod.container["command"][0], *volumes, IMAGE,
                         *args).stdout.strip()

        def ports():
            state = podman("inspect", "--format", "{{.State.Status}}", self.id).stdout.strip()
            if state not in ("running", "created", "configured"):
                raise RuntimeError(f"{name} is {state}: {self.logs()}")
            if not os.path.exists(self.port_file):
                return None
            return dict(line.split("=", 1) for line in open(self.port_file).read().split())
        self.ports = _wait_for(ports, 60, f"{name} to listen")
        os.remove(self.port_file)
        self.address = self.ports["grpc"]
        by_flag = {"--listen": "grpc", "--metrics_listen": "metrics", "--health_listen": "health"}
        self.by_manifest_port = {port: self.ports[by_flag[flag]]
                                 for flag, port in pod.listen_flags.items()}

    def logs(self):
        out = podman("logs", self.id, check=False)
        return out.stdout + out.stderr

    def inspect(self, template):
        return podman("inspect", "--format", template, self.id).stdout.strip()

    def remove(self):
        podman("rm", "-f", "-t", "0", self.id, check=False)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    if podman("image", "exists", IMAGE, check=False).returncode != 0:
        pytest.fail(f"no image {IMAGE}: build it with `make image`")
    tmp = str(tmp_path_factory.mktemp("image"))
    os.chmod(tmp, 0o755)
    objects = rendered("dev")
    secrets = make_secrets(os.path.join(tmp, "secrets"))
    os.chmod(os.path.join(tmp, "secrets"), 0o755)
    # Secret volumes: defaultMode 0440 and fsGroup 10001.
    for name in ("sluice-lease-secret", "sluice-admin-token"):
        own(secrets[name], 0o750)
        for key in os.listdir(secrets[name]):
            own(os.path.join(secrets[name], key), 0o440)
    datasets = os.path.join(tmp, "datasets")
    urls = [(u.replace(datasets, "/datasets"), n) for u, n in write_shards(datasets, 4, 10)]
    started = []
    try:
        coordinator_pod = Pod(objects, "Deployment", "sluice-coordinator", "coordinator", tmp,
                              secrets, datasets)
        data_pods = [Pod(objects, "StatefulSet", "sluice-dataserver", f"dataserver-{i}", tmp,
                         secrets, datasets) for i in range(2)]
        # Claims and emptyDirs: writable by fsGroup 10001.
        for pod in [coordinator_pod, *data_pods]:
            for mount, local in pod.mounts.items():
                if mount not in pod.secret_mounts and local != datasets:
                    own(local, 0o770)
        suffix = str(os.getpid())
        coordinator = Container(coordinator_pod, f"sluice-test-coordinator-{suffix}")
        started.append(coordinator)
        data = []
        for i, pod in enumerate(data_pods):
            data.append(Container(pod, f"sluice-test-dataserver-{i}-{suffix}",
                                  coordinator.address))
            started.append(data[-1])
        flags = [f"--coordinator={coordinator.address}"]
        _wait_for(lambda: live_data_servers(coordinator) == 2, 60,
                  "both data servers to register")
        manifest = os.path.join(tmp, "manifest.json")
        with open(manifest, "w") as f:
            json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
        yield dict(coordinator=coordinator, data=data, secrets=secrets, manifest=manifest,
                   total=40, flags=flags)
    finally:
        for c in reversed(started):
            c.remove()
        shutil.rmtree(tmp, ignore_errors=True)


def live_data_servers(coordinator):
    page = urllib.request.urlopen(f"http://{coordinator.ports['metrics']}/metrics",
                                  timeout=10).read().decode()
    line = next(l for l in page.splitlines() if l.startswith("sluice_coordinator_data_servers "))
    return int(float(line.split()[1]))


def sluicectl(*args):
    return subprocess.run([os.path.join(BIN, "sluicectl"), *args], capture_output=True, text=True)


def test_containers_run_as_10001_read_only_without_capabilities(deployment):
    for c in [deployment["coordinator"], *deployment["data"]]:
        assert c.inspect("{{.Config.User}}") == f"{UID}:{UID}"
        assert c.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true"
        pid = int(c.inspect("{{.State.Pid}}"))
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f.read().splitlines())
        assert status["Uid"].split()[:2] == [str(UID), str(UID)]
        assert int(status["CapEff"], 16) == 0


def test_the_probes_the_manifests_declare_answer(deployment):
    for c in [deployment["coordinator"], *deployment["data"]]:
        probes = c.pod.probes()
        assert {name for name, _, _ in probes} >= {"livenessProbe", "readinessProbe"}
        for name, port, service in probes:
            out = sluicectl("health", c.by_manifest_port[port], f"--service={service}")
            assert out.returncode == 0 and "SERVING" in out.stdout, (name, out.stdout + out.stderr)
        page = urllib.request.urlopen(f"http://{c.ports['metrics']}/metrics", timeout=10).read()
        assert b'sluice_build_info{' in page


def test_an_epoch_is_read_from_outside(deployment):
    token = os.path.join(deployment["secrets"]["sluice-admin-token"], "token")
    out = sluicectl("job", "create", "--name=image-epoch", f"--manifest={deployment['manifest']}",
                    f"--admin_token_file={token}", *deployment["flags"])
    assert out.returncode == 0, out.stdout + out.stderr
    out = sluicectl("read", "--job=image-epoch", *deployment["flags"])
    assert out.returncode == 0, out.stderr
    keys = collections.Counter(json.loads(line)["key"] for line in out.stdout.splitlines())
    assert len(keys) == deployment["total"] and set(keys.values()) == {1}


def test_a_stopped_data_server_drains_and_exits_0_within_the_grace_period(deployment):
    server = deployment["data"][1]
    grace = server.pod.grace_seconds
    podman("stop", "-t", str(grace), server.id)
    assert server.inspect("{{.State.ExitCode}}") == "0", server.logs()
    logs = server.logs()
    assert "draining" in logs and "stopped" in logs, logs
    # The coordinator counts one live data server from here on.
    _wait_for(lambda: live_data_servers(deployment["coordinator"]) == 1, 60,
              "the coordinator to drop the stopped data server")
