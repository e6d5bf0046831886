"""Builds the gRPC stubs (gen_protos.py) into the wheel: `pip install client/python`."""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        subprocess.run([sys.executable, os.path.join(HERE, "gen_protos.py"), self.build_lib,
                        os.path.join(HERE, "..", "..", "protos")], check=True)


setup(cmdclass={"build_py": BuildWithStubs})
