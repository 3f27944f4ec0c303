"""deploy/compose.yaml as Compose reads it: `docker-compose config` (Debian's docker-compose, which
validates the file against the Compose schema and renders it) for each profile, then checks on
the rendered stack that catch drift between the compose file and the rest of deploy/:
  * every bind-mounted host path exists (the Prometheus config and rules, Grafana provisioning
    and dashboards), and both specula services build from deploy/docker/Dockerfile;
  * Prometheus scrapes the name the specula services answer to (their network alias) on the
    metrics port the image listens on;
  * the stop grace period outlasts server.shutdown_grace_seconds of the shipped config, so a
    stop drains instead of killing requests;
  * Grafana refuses to start without an admin password (no admin/admin default).
The stack itself is not started: its Prometheus and Grafana images come from a registry.

Environment (CTest sets it): SPECULA_SOURCE_DIR.
"""

import os
import re
import subprocess
import unittest

import yaml

SOURCE = os.environ["SPECULA_SOURCE_DIR"]
DEPLOY = os.path.join(SOURCE, "deploy")
COMPOSE = os.path.join(DEPLOY, "compose.yaml")
METRICS_PORT = 9400  # the image's --metrics-listen (deploy/docker/Dockerfile)


def render(profile, password="test-password"):
    env = dict(os.environ, GRAFANA_ADMIN_PASSWORD=password) if password else {
        k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}
    return subprocess.run(["docker-compose", "-f", COMPOSE, "--profile", profile, "config"],
                          cwd=DEPLOY, env=env, capture_output=True, text=True, timeout=60)


def seconds(duration):
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


class ComposeTest(unittest.TestCase):
    def stack(self, profile):
        out = render(profile)
        self.assertEqual(out.returncode, 0, out.stderr)
        return yaml.safe_load(out.stdout)["services"]

    def test_each_profile_has_its_server_prometheus_and_grafana(self):
        # docker-compose 1.29's `config` renders every service whatever the profile: the profiles
        # are read off the services.
        services = self.stack("cpu")
        for profile, server in (("gpu", "specula-gpu"), ("cpu", "specula-cpu")):
            members = {name for name, s in services.items() if profile in s.get("profiles", [])}
            self.assertEqual(members, {server, "prometheus", "grafana"}, profile)
            build = services[server]["build"]
            self.assertEqual(os.path.realpath(build["context"]), os.path.realpath(SOURCE))
            self.assertTrue(os.path.isfile(os.path.join(SOURCE, build["dockerfile"])))
        gpu = self.stack("gpu")["specula-gpu"]
        devices = gpu["deploy"]["resources"]["reservations"]["devices"]
        self.assertEqual(devices[0]["driver"], "nvidia")
        self.assertIn("cuda", gpu["command"])
        self.assertEqual(self.stack("cpu")["specula-cpu"]["build"]["args"]["SPECULA_CUDA"], "OFF")

    def test_bind_mounts_exist(self):
        for service in self.stack("cpu").values():
            for volume in service.get("volumes", []):
                host = volume.split(":")[0]
                if host.startswith("/") and not host.endswith("/models"):
                    self.assertTrue(os.path.exists(host), f"{host} is mounted but missing")

    def test_prometheus_scrapes_the_servers_alias_and_metrics_port(self):
        services = self.stack("cpu")
        aliases = services["specula-cpu"]["networks"]["default"]["aliases"]
        with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        targets = [t for job in config["scrape_configs"]
                   for sc in job.get("static_configs", []) for t in sc.get("targets", [])]
        self.assertTrue(any(t == f"{alias}:{METRICS_PORT}" for alias in aliases for t in targets),
                        f"no scrape target among {targets} is {aliases}:{METRICS_PORT}")

    def test_stop_grace_outlasts_the_servers_drain(self):
        with open(os.path.join(DEPLOY, "config", "specula.yaml")) as f:
            drain = yaml.safe_load(f)["server"]["shutdown_grace_seconds"]
        for profile, server in (("gpu", "specula-gpu"), ("cpu", "specula-cpu")):
            grace = seconds(self.stack(profile)[server]["stop_grace_period"])
            self.assertGreater(grace, drain, profile)

    def test_grafana_needs_an_admin_password(self):
        out = render("cpu", password=None)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("GRAFANA_ADMIN_PASSWORD", out.stderr)


if __name__ == "__main__":
    unittest.main()
