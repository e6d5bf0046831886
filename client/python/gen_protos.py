#!/usr/bin/python3
"""Generates the Python gRPC stubs of Sluice's protos (never edited by hand).

usage: gen_protos.py OUT_DIR [PROTO_ROOT]

Writes the package `sluice.v1` (common, coordinator, dataserver: *_pb2.py and
*_pb2_grpc.py) under OUT_DIR, and the gRPC health stubs from Debian's
grpc-proto as `sluice.grpc_health.v1` (under `grpc.health.v1` they would clash
with the installed `grpc` package; the wire names are unchanged). Uses protoc
and grpc_python_plugin from Debian's protobuf-compiler-grpc.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ["sluice/v1/common.proto", "sluice/v1/coordinator.proto", "sluice/v1/dataserver.proto"]
HEALTH = "/usr/share/grpc-proto/grpc/health/v1/health.proto"


def main():
    out = os.path.abspath(sys.argv[1])
    root = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "..", "protos"))
    plugin = shutil.which("grpc_python_plugin")
    protoc = shutil.which("protoc")
    if plugin is None or protoc is None:
        sys.exit("gen_protos.py: protoc and grpc_python_plugin are needed "
                 "(Debian: protobuf-compiler protobuf-compiler-grpc)")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        health = os.path.join(tmp, "sluice", "grpc_health", "v1")
        os.makedirs(health)
        shutil.copy(HEALTH, os.path.join(health, "health.proto"))
        subprocess.run(
            [protoc, f"--plugin=protoc-gen-grpc_python={plugin}", f"-I{root}", f"-I{tmp}",
             f"--python_out={out}", f"--grpc_python_out={out}",
             *PROTOS, "sluice/grpc_health/v1/health.proto"],
            check=True)
    # Regular packages, so `sluice.v1` resolves inside the installed `sluice`.
    for pkg in ("sluice/v1", "sluice/grpc_health", "sluice/grpc_health/v1"):
        open(os.path.join(out, pkg, "__init__.py"), "a").close()


if __name__ == "__main__":
    main()
