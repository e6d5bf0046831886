"""`pip install client/python`: the package, the gRPC stubs (gen_protos.py)
and the sluice._core extension (the C++ client, built with the project's
CMake from the source tree around this directory).

SLUICE_BUILD_DIR=<a configured build tree> takes _core from that tree
(building its sluice_core_py target first) instead of configuring a fresh
one under build/ here; either needs the build dependencies (`make deps`).
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def _built_core():
    """The path of the built _core extension."""
    build_dir = os.environ.get("SLUICE_BUILD_DIR")
    if not build_dir:
        build_dir = os.path.join(HERE, "build", "cmake")
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release"],
                           check=True)
    subprocess.run(["cmake", "--build", build_dir, "--target", "sluice_core_py", "-j",
                    str(os.cpu_count() or 1)], check=True)
    found = glob.glob(os.path.join(build_dir, "python", "sluice", "_core*.so"))
    if not found:
        sys.exit(f"setup.py: no sluice/_core*.so in {build_dir}/python after building it")
    return found[0]


class BuildWithStubsAndCore(build_py):
    def run(self):
        super().run()
        subprocess.run([sys.executable, os.path.join(HERE, "gen_protos.py"), self.build_lib,
                        os.path.join(ROOT, "protos")], check=True)
        shutil.copy2(_built_core(), os.path.join(self.build_lib, "sluice"))


class BinaryDistribution(Distribution):
    """A wheel for this platform: it carries a compiled extension."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithStubsAndCore}, distclass=BinaryDistribution)
