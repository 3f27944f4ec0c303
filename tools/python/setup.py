"""Builds the specula-client package; the metadata is in pyproject.toml.

The gRPC stubs are not in the source tree: build_py generates them from ../../proto into the
build (gen_stubs.py), so `pip install ./tools/python` from a checkout needs protoc and
grpc_python_plugin (Debian: protobuf-compiler protobuf-compiler-grpc) and nothing from the
network (`--no-index --no-build-isolation`, see README.md).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_stubs  # noqa: E402


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        gen_stubs.generate(self.build_lib,
                           os.environ.get("SPECULA_PROTO_DIR", gen_stubs.DEFAULT_PROTO_DIR))


setup(cmdclass={"build_py": BuildPyWithStubs})
