"""The one check of what the client relies on in grpcio beyond its public
API (sluice/_grpcio.py): the installed grpcio passes it, and an unsupported
one makes `import sluice` fail naming the supported versions."""
import subprocess
import sys
import types

import grpc

from sluice import _grpcio


def test_the_installed_grpcio_has_everything_the_client_relies_on():
    assert _grpcio.check(grpc) == []


def test_each_missing_piece_is_named():
    problems = _grpcio.check(types.SimpleNamespace(__version__="1.48.2"))
    assert problems == [
        "version 1.48.2 is outside >=1.51,<2",
        "grpc.experimental.ChannelOptions.SingleThreadedUnaryStream",
        "grpc._channel._SingleThreadedRendezvous._consume_next_event",
    ]
    assert _grpcio.check(types.SimpleNamespace(__version__="2.0.0", experimental=grpc.experimental,
                                               _channel=grpc._channel)) == [
        "version 2.0.0 is outside >=1.51,<2"]


def test_importing_sluice_with_an_unsupported_grpcio_fails_naming_the_versions():
    code = "import grpc; grpc.__version__ = '1.40.0'; import sluice"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert ("ImportError: sluice needs grpcio >=1.51,<2 (tested with 1.51.x); the installed "
            "grpcio 1.40.0 does not fit: version 1.40.0 is outside >=1.51,<2") in out.stderr
