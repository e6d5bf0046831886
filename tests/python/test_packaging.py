"""`pip install client/python` where pip exists: the wheel carries the
generated stubs and the sluice._core extension, and works against the real
servers. Built from a copy of the sources in a temp dir (pip builds in the
source tree), installed with --target into another, no network (--no-index,
--no-build-isolation: Debian's setuptools and wheel). The extension comes
from the test's own build tree (SLUICE_BUILD_DIR), not a second build."""
import os
import shutil
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _build_dir():
    """The build tree whose bin/ the tests run (SLUICE_BIN_DIR is its bin)."""
    from conftest import BIN
    return os.path.dirname(os.path.abspath(BIN))


def test_pip_install_gives_a_working_package(cluster, tmp_path):
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    assert pip.returncode == 0, "pip is missing: `make deps` installs python3-pip"
    src = tmp_path / "src"
    shutil.copytree(os.path.join(ROOT, "client", "python"), src / "client" / "python")
    shutil.copytree(os.path.join(ROOT, "protos"), src / "protos")
    target = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(target),
                          str(src / "client" / "python")],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, SLUICE_BUILD_DIR=_build_dir()))
    assert out.returncode == 0, out.stdout + out.stderr
    cluster.create_job("packaged")
    script = textwrap.dedent(f"""
        import sluice, sluice.tls, sluice.torch
        from sluice.v1 import coordinator_pb2_grpc, dataserver_pb2_grpc
        from sluice.grpc_health.v1 import health_pb2_grpc
        assert sluice.__file__.startswith({str(target)!r}), sluice.__file__
        from sluice import _core
        assert _core.__file__.startswith({str(target)!r}), _core.__file__
        with sluice.Reader({cluster.address!r}, "packaged") as r:
            print(len({{s.key for s in r}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(target))  # not build/python
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == str(cluster.total)
