"""The shipped monitoring against a real server and a real Prometheus.

A specula-server (tiny model, sparse KV on, so the prefetch metrics move) serves real requests
over gRPC: sparse generations, a two-turn session, a refused request. Then Debian's Prometheus
runs on loopback from deploy/prometheus/prometheus.yml (only the target and the intervals
rewritten) with the shipped rules, scrapes the server, and every PromQL expression of the
Grafana dashboard and of the rules goes through its HTTP API: each must parse and return series,
except the ones listed in MAY_BE_EMPTY with the reason. The rules must load and evaluate without
error, and what Prometheus scraped must count exactly the requests made.

Environment (CTest sets it): SPECULA_SERVER, SPECULA_TEST_MODEL, SPECULA_SOURCE_DIR,
PROMETHEUS (the binary), PYTHONPATH (the Python client).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

import grpc
import yaml
from specula_client import SpeculaClient

SERVER = os.environ["SPECULA_SERVER"]
MODEL = os.environ["SPECULA_TEST_MODEL"]
SOURCE = os.environ["SPECULA_SOURCE_DIR"]
PROMETHEUS = os.environ.get("PROMETHEUS", "prometheus")
DEPLOY = os.path.join(SOURCE, "deploy")
RULES = os.path.join(DEPLOY, "prometheus", "rules", "specula.rules.yml")
DASHBOARD = os.path.join(DEPLOY, "grafana", "dashboards", "specula.json")
DATASOURCE_UID = "specula-prometheus"  # deploy/grafana/provisioning/datasources/prometheus.yml
# The served model id (the model directory's name): the request metrics' `model` label, which the
# dashboard's $model variable selects.
SERVED_MODEL = os.path.basename(MODEL.rstrip("/"))
# The families that carry `model` (server/metrics.cc): every dashboard selector over them must
# honour $model, or the variable would silently not filter that panel.
REQUEST_FAMILIES = (
    "specula_time_to_first_token_seconds", "specula_time_between_tokens_seconds",
    "specula_e2e_request_latency_seconds", "specula_request_queue_time_seconds",
    "specula_request_prompt_tokens", "specula_request_output_tokens",
    "specula_prompt_tokens_total", "specula_generation_tokens_total",
    "specula_prefix_cache_hit_tokens_total", "specula_requests_total",
    "specula_tool_call_parse_failures_total")

# Expressions that may legitimately return nothing in this run, and why.
MAY_BE_EMPTY = {
    # Nothing failed on the server's side, so the numerator has no series.
    "job_model:specula_requests_server_errors:ratio_rate5m": "no request ended in a server error",
}
SERVER_CONFIG = """
server:
  listen: "127.0.0.1:0"
  metrics_listen: "127.0.0.1:0"
kv_cache:
  page_size: 16
sparse:
  enabled: true
  budget_tokens: 32
  sink_tokens: 16
  recent_tokens: 16
  min_context_tokens: 0
"""
REQUESTS = 5  # what run_requests sends (the scrape must count exactly these)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def dashboard_exprs():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    exprs = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$job", "specula").replace("$instance", ".*")
                    .replace("$model", SERVED_MODEL).replace("$__rate_interval", "1m"))
            exprs.append((f'panel "{panel["title"]}" {target["refId"]}', expr))
    for var in dash["templating"]["list"]:
        query = var["query"]["query"]
        if query.startswith("label_values("):  # a Grafana function: its metric selector
            inner = query[len("label_values("):query.rindex(",")].replace("$job", "specula")
            exprs.append((f"variable {var['name']}", inner))
    return exprs


def rule_exprs():
    with open(RULES) as f:
        groups = yaml.safe_load(f)["groups"]
    return [(r.get("record") or r.get("alert"), r["expr"], "alert" in r)
            for g in groups for r in g["rules"]]


class PrometheusE2eTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specula_prom_")
        cls.procs = []
        cls.logs = []
        cls.start_server()
        cls.run_requests()
        cls.start_prometheus()

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            p.terminate()
            p.wait(timeout=60)
        for log in cls.logs:
            log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def open_log(cls, name):
        cls.logs.append(open(os.path.join(cls.tmp, name), "wb"))
        return cls.logs[-1]

    @classmethod
    def start_server(cls):
        config = os.path.join(cls.tmp, "specula.yaml")
        with open(config, "w") as f:
            f.write(SERVER_CONFIG)
        ready = os.path.join(cls.tmp, "ready.json")
        log = cls.open_log("server.log")
        cls.procs.append(subprocess.Popen(
            [SERVER, "--config", config, "--model", MODEL, "--ready-file", ready],
            stdout=log, stderr=subprocess.STDOUT))
        # The server renames the ready file into place whole: it exists only complete.
        wait_for(lambda: os.path.exists(ready), "specula-server to start")
        with open(ready) as f:
            cls.addresses = json.load(f)

    @classmethod
    def run_requests(cls):
        client = SpeculaClient(cls.addresses["listen"], timeout=60)
        prompt = [1 + (7 * i) % 300 for i in range(160)]
        for seed in (1, 2):
            list(client.generate(prompt_token_ids=prompt, max_tokens=24, ignore_eos=True,
                                 seed=seed, sparse_mode="sparse"))
        first = list(client.generate(prompt_token_ids=prompt, max_tokens=8, ignore_eos=True,
                                     temperature=0.0, session_id="monitoring"))
        turn = prompt + [t for c in first for t in c.token_ids] + [5, 6, 7]
        list(client.generate(prompt_token_ids=turn, max_tokens=8, ignore_eos=True,
                             temperature=0.0, session_id="monitoring"))
        with cls.assertRaises(cls(), grpc.RpcError):  # refused: over the context length
            list(client.generate(prompt_token_ids=prompt, max_tokens=10 ** 7))
        client.close()

    @classmethod
    def start_prometheus(cls):
        with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "1s"
        config["global"]["evaluation_interval"] = "1s"
        config["rule_files"] = [RULES]
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "specula"]
        job["scrape_interval"] = "1s"
        job["static_configs"] = [{"targets": [cls.addresses["metrics_listen"]]}]
        path = os.path.join(cls.tmp, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f)
        # A port free when chosen may be taken before Prometheus binds it (a test running beside
        # this one binds port 0): Prometheus then exits, and another port is tried. Until it is
        # ready, what answers on the port may be that other server, so nothing is asked before.
        for attempt in range(5):
            cls.prom = f"127.0.0.1:{free_port()}"
            proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={path}", f"--storage.tsdb.path={cls.tmp}/data",
                 f"--web.listen-address={cls.prom}"],
                stdout=cls.open_log(f"prometheus-{attempt}.log"), stderr=subprocess.STDOUT)
            wait_for(lambda: proc.poll() is not None or cls.ready(), "Prometheus to start",
                     timeout=120)
            if proc.poll() is None:
                cls.procs.append(proc)
                break
        else:
            raise AssertionError("Prometheus exited on 5 ports in a row (see prometheus-*.log)")
        # Three scrapes of the server, so rate() over the window has samples to work with.
        wait_for(lambda: cls.value('count_over_time(up{job="specula"}[5m])') >= 3,
                 "three scrapes of specula-server", timeout=120)

    @classmethod
    def ready(cls):
        try:
            with urllib.request.urlopen(f"http://{cls.prom}/-/ready", timeout=10) as r:
                return r.status == 200 and b"Prometheus" in r.read()
        except OSError:  # refused, or an HTTP error status
            return False

    @classmethod
    def api(cls, path, **params):
        url = f"http://{cls.prom}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)
        except OSError:
            return {"status": "unreachable"}

    @classmethod
    def value(cls, expr):
        out = cls.api("query", query=expr)
        if out.get("status") != "success" or not out["data"]["result"]:
            return 0.0
        return float(out["data"]["result"][0]["value"][1])

    def query(self, name, expr):
        out = self.api("query", query=expr)
        self.assertEqual(out.get("status"), "success", f"{name}: {expr}\n{out.get('error')}")
        return out["data"]["result"]

    def test_the_target_is_up_and_counts_exactly_the_requests_made(self):
        self.assertEqual(self.value('up{job="specula"}'), 1.0)
        self.assertEqual(self.value('sum(specula_requests_total{job="specula"})'), REQUESTS)
        self.assertEqual(
            self.value(f'sum(specula_requests_total{{job="specula", model="{SERVED_MODEL}"}})'),
            REQUESTS)
        self.assertGreater(self.value('sum(specula_prefetch_hits_total{job="specula"})'), 0)
        self.assertGreater(self.value('sum(specula_prefix_cache_hit_tokens_total{job="specula"})'), 0)

    def test_every_dashboard_expression_parses_and_returns_series(self):
        exprs = dashboard_exprs()
        self.assertGreater(len(exprs), 20)
        for name, expr in exprs:
            with self.subTest(name):
                self.assertTrue(self.query(name, expr), f"{name} returned nothing: {expr}")

    def test_every_rule_expression_parses_and_recordings_return_series(self):
        for name, expr, is_alert in rule_exprs():
            with self.subTest(name):
                result = self.query(name, expr)
                # Alert conditions are false on a healthy server: empty is their right answer.
                if not is_alert and name not in MAY_BE_EMPTY:
                    self.assertTrue(result, f"{name} returned nothing: {expr}")

    def test_the_rules_load_and_evaluate_without_error(self):
        def evaluated():
            groups = self.api("rules")["data"]["groups"]
            return groups and all(r.get("lastEvaluation", "").startswith("20")
                                  and not r["lastEvaluation"].startswith("0001")
                                  for g in groups for r in g["rules"])
        wait_for(evaluated, "every rule evaluated once")
        rules = [r for g in self.api("rules")["data"]["groups"] for r in g["rules"]]
        self.assertEqual(len(rules), len(rule_exprs()))
        for r in rules:
            self.assertEqual(r["health"], "ok", f"{r['name']}: {r.get('lastError')}")
        firing = [r["name"] for r in rules if r["type"] == "alerting" and r["state"] != "inactive"]
        self.assertEqual(firing, [], "a healthy server must not raise alerts")

    def test_every_dashboard_selector_of_a_request_metric_honours_the_model_variable(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        selectors = 0
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                for family, selector in re.findall(
                        r"(%s)(?:_bucket|_sum|_count)?(\{[^}]*\})" % "|".join(REQUEST_FAMILIES),
                        target["expr"]):
                    selectors += 1
                    self.assertIn('model=~"$model"', selector, f'panel "{panel["title"]}"')
        self.assertGreater(selectors, 10)
        (model,) = [v for v in dash["templating"]["list"] if v["name"] == "model"]
        self.assertTrue(model["includeAll"])

    def test_the_dashboard_is_well_formed(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        ids = [p["id"] for p in dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        for panel in dash["panels"]:
            if panel["type"] == "row":
                continue
            self.assertEqual(panel["datasource"]["uid"], DATASOURCE_UID, panel["title"])
            self.assertTrue(panel["targets"], panel["title"])
            for t in panel["targets"]:
                self.assertTrue(t["expr"], panel["title"])
                self.assertEqual(t["datasource"]["uid"], DATASOURCE_UID, panel["title"])
        with open(os.path.join(DEPLOY, "grafana", "provisioning", "datasources",
                               "prometheus.yml")) as f:
            uids = [d["uid"] for d in yaml.safe_load(f)["datasources"]]
        self.assertIn(DATASOURCE_UID, uids)


if __name__ == "__main__":
    unittest.main()
