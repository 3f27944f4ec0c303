"""The container image as a user runs it: deploy/docker/Dockerfile, CPU variant, built and run
with podman on this machine.

No image registry is reachable here, so the Debian base image is made locally first
(deploy/docker/make-debian-base.sh: debootstrap, then podman import). The image is then built
from the repository and run with its ports published on loopback, and the checks reach it from
the host: a Generate call over gRPC, the OpenAI-compatible HTTP API, a /metrics scrape that
counts that call, the image's HEALTHCHECK, a model mounted at /models, the non-root user, a
runtime image without the toolchain, and a graceful stop.

Environment (CTest sets it): SPECULA_SOURCE_DIR, SPECULA_WORK_DIR (base rootfs, logs),
SPECULA_TEST_MODEL (a model directory to mount), PYTHONPATH (the Python client),
CONTAINERS_CONF (this directory's containers.conf).
"""

import json
import os
import subprocess
import time
import unittest
import urllib.request

from specula_client import SpeculaClient

SOURCE = os.environ["SPECULA_SOURCE_DIR"]
WORK = os.environ["SPECULA_WORK_DIR"]
TEST_MODEL = os.environ["SPECULA_TEST_MODEL"]
IMAGE = "localhost/specula:cpu-test"
BASE = "docker.io/library/debian:bookworm"
USER_ID = "10001"


def podman(*args, check=True, timeout=120, **kwargs):
    return subprocess.run(["podman", *args], check=check, timeout=timeout, text=True,
                          capture_output=True, **kwargs)


# The revision the image is built from (the build context has no .git: it is passed in).
REVISION = subprocess.run(["git", "-C", SOURCE, "rev-parse", "--short=12", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"


def build_image():
    os.makedirs(WORK, exist_ok=True)
    subprocess.run([os.path.join(SOURCE, "deploy/docker/make-debian-base.sh"), WORK],
                   check=True, timeout=900)
    log_path = os.path.join(WORK, "build.log")
    start = time.monotonic()
    with open(log_path, "w") as log:
        done = subprocess.run(
            ["podman", "build", "--format", "docker", "-f", "deploy/docker/Dockerfile",
             "-t", IMAGE, "--build-arg", f"BUILD_IMAGE={BASE}",
             "--build-arg", f"RUNTIME_IMAGE={BASE}", "--build-arg", "SPECULA_CUDA=OFF",
             "--build-arg", f"SPECULA_GIT_REVISION={REVISION}", "."],
            cwd=SOURCE, stdout=log, stderr=subprocess.STDOUT, timeout=2100)
    if done.returncode != 0:
        with open(log_path) as log:
            raise AssertionError("podman build failed:\n" + log.read()[-6000:])
    size = podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip()
    print(f"image built in {time.monotonic() - start:.0f} s, {int(size) / 1e6:.0f} MB",
          flush=True)


class Container:
    """One running container of the image, its ports published on free loopback ports."""

    def __init__(self, name, *args, volumes=()):
        self.name = name
        podman("rm", "-f", name, check=False)
        cmd = ["run", "-d", "--name", name]
        for port in (50051, 8000, 9400):
            cmd += ["-p", f"127.0.0.1::{port}"]
        for v in volumes:
            cmd += ["-v", v]
        podman(*cmd, IMAGE, *args)
        self.grpc = self.port(50051)
        self.http = self.port(8000)
        self.metrics = self.port(9400)
        self.client = SpeculaClient(self.grpc, timeout=30)
        try:
            self.client.wait_until_serving(timeout=120)
        except Exception:
            raise AssertionError("the container never served:\n" + self.logs())

    def port(self, container_port):
        out = podman("port", self.name, f"{container_port}/tcp", check=False).stdout.strip()
        if not out:
            raise AssertionError(f"no published port {container_port} (has the container "
                                 f"exited?):\n" + self.logs())
        return out.splitlines()[0]

    def logs(self):
        out = podman("logs", self.name, check=False)
        return (out.stdout + out.stderr)[-4000:]

    def get(self, port_address, path):
        with urllib.request.urlopen(f"http://{port_address}{path}", timeout=30) as r:
            return r.status, r.read().decode()

    def remove(self):
        self.client.close()
        podman("rm", "-f", "-t", "0", self.name, check=False)


def counter(exposition, name):
    """The sum of a metric's samples in a Prometheus text exposition."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            total += float(line.rsplit(" ", 1)[1])
    return total


class ContainerImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        build_image()
        cls.server = Container(f"specula-test-{os.getpid()}")

    @classmethod
    def tearDownClass(cls):
        cls.server.remove()

    def test_generate_reaches_the_container_and_metrics_count_it(self):
        before = counter(self.server.get(self.server.metrics, "/metrics")[1],
                         "specula_requests_total")
        chunks = list(self.server.client.generate("Hello from the host", max_tokens=8,
                                                  temperature=0.0, ignore_eos=True))
        self.assertEqual(sum(len(c.token_ids) for c in chunks), 8)
        status, exposition = self.server.get(self.server.metrics, "/metrics")
        self.assertEqual(status, 200)
        self.assertEqual(counter(exposition, "specula_requests_total"), before + 1,
                         "the scrape must count the Generate call just made")

    def test_openai_http_api_answers(self):
        status, body = self.server.get(self.server.http, "/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["object"], "list")

    def test_healthcheck_probes_the_grpc_health_service(self):
        image = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
        self.assertIn("specula-cli", " ".join(image["Healthcheck"]["Test"]))
        self.assertEqual(podman("healthcheck", "run", self.server.name, check=False).returncode,
                         0, self.server.logs())

    def test_version_names_the_revision_it_was_built_from(self):
        version = podman("run", "--rm", IMAGE, "--version").stdout
        self.assertIn(f"(git {REVISION},", version)

    def test_runs_as_a_non_root_user(self):
        self.assertEqual(podman("exec", self.server.name, "id", "-u").stdout.strip(), USER_ID)

    def test_the_runtime_image_has_no_toolchain(self):
        found = podman("run", "--rm", "--entrypoint", "sh", IMAGE, "-c",
                       "command -v g++ cc cmake ninja nvcc || true").stdout.strip()
        self.assertEqual(found, "")

    def test_a_model_mounted_at_models_is_served(self):
        other = Container(f"specula-test-model-{os.getpid()}", "--model", "/models/tiny",
                          volumes=[f"{TEST_MODEL}:/models/tiny:ro"])
        try:
            info = other.client.model_info()
            self.assertEqual(info.architecture, "Qwen3ForCausalLM")
        finally:
            other.remove()

    def test_sigterm_drains_and_exits_zero(self):
        c = Container(f"specula-test-stop-{os.getpid()}")
        try:
            podman("stop", "-t", "30", c.name)
            state = json.loads(podman("inspect", c.name).stdout)[0]["State"]
            self.assertEqual(state["ExitCode"], 0, c.logs())
            self.assertIn("event=stopped", c.logs())
        finally:
            c.remove()


if __name__ == "__main__":
    if os.geteuid() != 0:
        # debootstrap and rootful podman need root; CTest reports the test as skipped (77).
        print("deploy_container: needs root (debootstrap, rootful podman); skipped")
        raise SystemExit(77)
    unittest.main()
