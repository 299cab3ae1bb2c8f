"""Builds the meshrun Python package (python/meshrun) with its gRPC stubs
generated from proto/ (python/generate_grpc_stubs.py): `pip install .` from
the repository. Metadata is in pyproject.toml."""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import generate_grpc_stubs  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        generate_grpc_stubs.generate(self.build_lib)


# Out of build/, which is CMake's.
setup(cmdclass={"build_py": BuildPyWithStubs}, options={"build": {"build_base": "build-python"}})
