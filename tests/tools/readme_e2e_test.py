"""The README as a new user follows it, on this checkout (issue 17).

Installs the Python client with the README's own commands (into a temporary venv), imports it
from a folder that holds a directory named `specula` (as the folder holding a clone does) and from
the checkout's parent, and runs the README's Python example and tools/python/examples/generate.py
against a real server.

Environment (CTest sets it): SPECULA_SERVER, the server binary. By hand:

    SPECULA_SERVER=build/server/specula-server /usr/bin/python3 tests/tools/readme_e2e_test.py -v
"""

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.environ.get("SPECULA_SERVER", os.path.join(_REPO, "build", "server", "specula-server"))


def readme_blocks(language):
    with open(os.path.join(_REPO, "README.md")) as f:
        return re.findall(r"```%s\n(.*?)```" % language, f.read(), re.S)


class ReadmeE2ETest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specula_readme_")
        cls.venv = os.path.join(cls.tmp, "venv")
        install = [b for b in readme_blocks("bash") if "pip install" in b]
        assert len(install) == 1, "the README has one block that installs the Python client"
        # Exactly the README's commands, run from the checkout, with the venv in our temp dir.
        cls.install = subprocess.run(install[0].replace(".venv", cls.venv), shell=True,
                                     cwd=_REPO, capture_output=True, text=True,
                                     executable="/bin/bash")
        cls.python = os.path.join(cls.venv, "bin", "python")
        # A folder holding a clone: it contains a directory named `specula`.
        cls.holder = os.path.join(cls.tmp, "holder")
        os.makedirs(os.path.join(cls.holder, "specula", "proto"))
        ready = os.path.join(cls.tmp, "ready.json")
        cls.log = open(os.path.join(cls.tmp, "server.log"), "wb")
        cls.server = subprocess.Popen(
            [SERVER, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--ready-file", ready],
            stdout=cls.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, SPECULA_CACHE_DIR=os.path.join(cls.tmp, "cache")))
        deadline = time.monotonic() + 120
        while not os.path.exists(ready) and time.monotonic() < deadline:
            assert cls.server.poll() is None, "specula-server exited"
            time.sleep(0.05)
        with open(ready) as f:
            cls.address = json.load(f)["listen"]

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(timeout=60)
        cls.log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_python(self, code_or_args, cwd):
        args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
        return subprocess.run([self.python, *args], cwd=cwd, capture_output=True, text=True,
                              timeout=120)

    def test_a_install_as_documented(self):
        self.assertEqual(self.install.returncode, 0, self.install.stdout + self.install.stderr)
        self.assertIn("Successfully installed specula-client", self.install.stdout)

    def test_import_beside_a_folder_named_specula(self):
        for cwd in (self.holder, os.path.dirname(_REPO)):
            r = self.run_python("import specula_client; print(specula_client.SpeculaClient)", cwd)
            self.assertEqual(r.returncode, 0, "from %s:\n%s" % (cwd, r.stderr))
            # The installed package, not a source folder that happens to be on the path.
            r = self.run_python("import specula_client; print(specula_client.__file__)", cwd)
            self.assertIn(self.venv, r.stdout)

    def test_readme_python_example(self):
        examples = [b for b in readme_blocks("python") if "SpeculaClient" in b]
        self.assertEqual(len(examples), 1)
        code = examples[0].replace("127.0.0.1:50051", self.address)
        r = self.run_python(code, self.holder)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[-2], "4096 SERVING")  # the embedded model's context, health
        finish, completion_tokens, sparse = lines[-1].split()
        self.assertIn(finish, ("LENGTH", "STOP"))
        self.assertGreater(int(completion_tokens), 0)
        self.assertEqual(sparse, "False")

    def test_coexists_with_the_official_health_stubs(self):
        # grpcio-health-checking's stubs register grpc_health/v1/health.proto; generate the same
        # module here (the wheel is not in Debian) and use both in one process.
        out = os.path.join(self.tmp, "official")
        health_root = os.path.join(self.tmp, "health_root")
        os.makedirs(os.path.join(health_root, "grpc_health", "v1"))
        os.makedirs(out)
        shutil.copyfile(os.path.join(_REPO, "proto", "grpc", "health", "v1", "health.proto"),
                        os.path.join(health_root, "grpc_health", "v1", "health.proto"))
        subprocess.run(["protoc", "-I" + health_root, "--python_out=" + out,
                        "--grpc_python_out=" + out,
                        "--plugin=protoc-gen-grpc_python=" + shutil.which("grpc_python_plugin"),
                        "grpc_health/v1/health.proto"], cwd=health_root, check=True)
        code = ("import sys; sys.path.insert(0, %r)\n"
                "from grpc_health.v1 import health_pb2\n"
                "from specula_client import SpeculaClient\n"
                "print(SpeculaClient(%r).health(), health_pb2.HealthCheckRequest.DESCRIPTOR.name)"
                % (out, self.address))
        r = self.run_python(code, self.holder)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "SERVING HealthCheckRequest")

    def test_example_script(self):
        r = self.run_python([os.path.join(_REPO, "tools", "python", "examples", "generate.py"),
                             "--server", self.address, "--prompt", "Hello",
                             "--max-tokens", "8"], self.holder)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("completion_tokens=", r.stderr)


if __name__ == "__main__":
    unittest.main()
