"""Workloads of a rendered kustomize overlay, made runnable on this machine:
the container's arguments with $(VARS) resolved from the rendered ConfigMap
and the downward API, and each volume mount given a local directory (the
operator's Secrets as directories of their keys). Used by the deployment
tests that run the manifests' own arguments (test_tls_layout.py,
test_image.py)."""
import os
import re
import socket
import subprocess

import yaml

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
NAMESPACE = "sluice"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_secrets(directory):
    """The Secrets k8s/README.md tells the operator to create, each a
    directory of its keys: {secret name: directory}, plus "ca.crt": the CA's
    certificate file."""
    os.makedirs(directory)
    d = lambda name: os.path.join(directory, name)  # noqa: E731
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", d("ca.key"), "-out", d("ca.crt"), "-days", "2",
            "-subj", "/CN=sluice-ca")
    # Locally every name is 127.0.0.1; the cluster names are in the SANs too.
    sans = {"sluice-coordinator-tls": "subjectAltName=IP:127.0.0.1,DNS:sluice-coordinator,"
                                      f"DNS:sluice-coordinator.{NAMESPACE}.svc",
            "sluice-dataserver-tls": "subjectAltName=IP:127.0.0.1,"
                                     f"DNS:*.sluice-dataserver.{NAMESPACE}.svc"}
    secrets = {}
    for name, ext in sans.items():
        os.makedirs(d(name))
        with open(d(name + ".ext"), "w") as f:
            f.write(ext + "\n")
        openssl("req", "-new", *ec, "-keyout", d(f"{name}/tls.key"), "-out", d(name + ".csr"),
                "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", d(name + ".csr"), "-CA", d("ca.crt"), "-CAkey", d("ca.key"),
                "-CAcreateserial", "-days", "2", "-out", d(f"{name}/tls.crt"), "-extfile",
                d(name + ".ext"))
        with open(d("ca.crt")) as src, open(d(f"{name}/ca.crt"), "w") as dst:
            dst.write(src.read())
        secrets[name] = d(name)
    for name, key in (("sluice-lease-secret", "secret"), ("sluice-admin-token", "token")):
        os.makedirs(d(name))
        with open(d(f"{name}/{key}"), "w") as f:
            f.write(os.urandom(16).hex())
        secrets[name] = d(name)
    secrets["ca.crt"] = d("ca.crt")
    return secrets


def rendered(overlay):
    """The overlay's objects, as `kubectl kustomize` renders them."""
    out = subprocess.run(["kubectl", "kustomize", os.path.join(ROOT, "k8s", "overlays", overlay)],
                         check=True, capture_output=True, text=True).stdout
    return [o for o in yaml.safe_load_all(out) if o]


class Pod:
    """One rendered workload's container, its arguments made local."""

    def __init__(self, objects, kind, name, pod_name, workdir, secrets, datasets):
        workload = next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)
        config = next(o for o in objects if o["kind"] == "ConfigMap" and
                      o["metadata"]["name"] == "sluice-config")["data"]
        spec = workload["spec"]["template"]["spec"]
        self.container = spec["containers"][0]
        self.binary = os.path.basename(self.container["command"][0])
        env = {}
        for e in self.container.get("env", []):
            source = e.get("valueFrom", {})
            if "configMapKeyRef" in source:
                env[e["name"]] = config[source["configMapKeyRef"]["key"]]
            elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[e["name"]] = pod_name
            elif source.get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
                env[e["name"]] = NAMESPACE
            elif source.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                env[e["name"]] = socket.gethostname()  # every local "pod" runs here
            else:
                env[e["name"]] = e["value"]
        self.grace_seconds = spec.get("terminationGracePeriodSeconds", 30)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.mounts = {}  # mountPath -> local directory
        self.read_only = {}  # mountPath -> mounted read-only
        self.secret_mounts = set()
        for m in self.container["volumeMounts"]:
            self.read_only[m["mountPath"]] = bool(m.get("readOnly"))
            v = volumes.get(m["name"], {})
            if "secret" in v:
                local = secrets[v["secret"]["secretName"]]
                self.secret_mounts.add(m["mountPath"])
            elif v.get("persistentVolumeClaim", {}).get("claimName") == "sluice-datasets":
                local = datasets
            else:
                local = os.path.join(workdir, pod_name, m["name"])
                os.makedirs(local, exist_ok=True)
            self.mounts[m["mountPath"]] = local
        self.args = [re.sub(r"\$\(([A-Z_]+)\)", lambda v: env[v.group(1)], a)
                     for a in self.container["args"]]
        self.listen_flags = {}  # flag -> port in the manifest

    def local_args(self, coordinator=None):
        out = []
        for arg in self.args:
            flag, _, value = arg.partition("=")
            if flag in ("--listen", "--metrics_listen", "--health_listen"):
                self.listen_flags[flag] = int(value.rsplit(":", 1)[1])
                out.append(f"{flag}=127.0.0.1:0")
                continue
            if flag == "--coordinator":
                out.append(f"--coordinator={coordinator}")
                continue
            if flag == "--advertise":  # a pod DNS name: the bound address here
                continue
            for mount in sorted(self.mounts, key=len, reverse=True):
                if value == mount or value.startswith(mount + "/"):
                    value = self.mounts[mount] + value[len(mount):]
                    break
            out.append(f"{flag}={value}")
        return out

    def probes(self):
        """(probe name, manifest port, health service) of each gRPC probe."""
        return [(p, self.container[p]["grpc"]["port"], self.container[p]["grpc"].get("service", ""))
                for p in ("startupProbe", "livenessProbe", "readinessProbe")
                if p in self.container]
