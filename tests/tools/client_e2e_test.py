"""End-to-end test of the clients against the real server.

Starts `specula-server` on ephemeral ports with the embedded default model (its sparse KV cache
on for the requests that ask for it), then checks that the Python client
(the specula_client package), `specula-cli` in server mode and `specula-cli generate
--offline` agree, that sparse requests report kv_stats, that errors and deadlines come back as
the right gRPC status, and that SIGTERM drains the server and exits 0.

Environment (CTest sets it, see CMakeLists.txt): SPECULA_SERVER, SPECULA_CLI (binaries) and
PYTHONPATH=<build>/python (the client package as the build writes it). Run by hand:

    SPECULA_SERVER=build/server/specula-server SPECULA_CLI=build/tools/specula-cli \
    PYTHONPATH=build/python /usr/bin/python3 tests/tools/client_e2e_test.py -v
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
import grpc  # noqa: E402
from specula_client import SpeculaClient  # noqa: E402

SERVER = os.environ.get("SPECULA_SERVER", os.path.join(_REPO, "build", "server", "specula-server"))
CLI = os.environ.get("SPECULA_CLI", os.path.join(_REPO, "build", "tools", "specula-cli"))
READY_TIMEOUT_S = 120
PROMPT = "The quick brown fox"
MAX_TOKENS = 24
# A working set of 4 pages (16-token sink, recent window and 32-token budget) is far below this
# prompt, so a sparse request selects pages. min_context_tokens keeps requests that do not ask
# for sparse dense, so the other tests see the dense engine (and agree with --offline).
SPARSE_BUDGET = 32
CONFIG = """
server:
  reflection: true
sparse:
  enabled: true
  budget_tokens: %d
  sink_tokens: 16
  recent_tokens: 16
  min_context_tokens: 1000000
  host_capacity_tokens: 16384
""" % SPARSE_BUDGET
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 12)


class ClientE2ETest(unittest.TestCase):
    """One server for the whole class; the last test (test_zz_*) shuts it down."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specula_e2e_")
        # A private model cache: the server and the offline CLI then surely load the same files.
        cls.env = dict(os.environ, SPECULA_CACHE_DIR=os.path.join(cls.tmp, "cache"))
        ready = os.path.join(cls.tmp, "ready.json")
        cls.log_path = os.path.join(cls.tmp, "server.log")
        cls.log = open(cls.log_path, "wb")
        config = os.path.join(cls.tmp, "specula.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        cls.server = subprocess.Popen(
            [SERVER, "--config", config, "--listen", "127.0.0.1:0", "--metrics-listen",
             "127.0.0.1:0", "--ready-file", ready, "--device", "cpu"],
            stdout=cls.log, stderr=subprocess.STDOUT, env=cls.env)
        try:
            cls.addresses = cls._wait_ready(ready)
        except Exception:
            cls._stop_server()
            raise
        cls.address = cls.addresses["listen"]
        cls.client = SpeculaClient(cls.address, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls._stop_server()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def _wait_ready(cls, ready):
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if cls.server.poll() is not None:
                raise RuntimeError("specula-server exited with %d before it was ready:\n%s"
                                   % (cls.server.returncode, cls._server_log()))
            if os.path.exists(ready):  # renamed into place, so complete once visible
                with open(ready) as f:
                    return json.load(f)
            time.sleep(0.05)
        raise RuntimeError("specula-server not ready after %ds:\n%s"
                           % (READY_TIMEOUT_S, cls._server_log()))

    @classmethod
    def _stop_server(cls):
        if cls.server.poll() is None:
            cls.server.kill()
            cls.server.wait()
        cls.log.close()

    @classmethod
    def _server_log(cls):
        cls.log.flush()
        with open(cls.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def cli(self, *args, server=True, timeout=120):
        cmd = [CLI, *args]
        if server:
            cmd.append("--server=" + self.address)
        return subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)

    def cli_ok(self, *args, **kwargs):
        r = self.cli(*args, **kwargs)
        self.assertEqual(r.returncode, 0, "specula-cli %s failed:\n%s" % (args, r.stderr))
        return r.stdout

    @staticmethod
    def one_line(stdout):
        # The CLI ends the text with one newline of its own.
        assert stdout.endswith("\n"), repr(stdout)
        return stdout[:-1]

    # --- generate -------------------------------------------------------------------------

    def test_greedy_generate_agrees_across_clients(self):
        chunks = list(self.client.generate(PROMPT, max_tokens=MAX_TOKENS, temperature=0.0))
        self.assertTrue(chunks)
        py_text = "".join(c.text for c in chunks)
        ids = [t for c in chunks for t in c.token_ids]
        last = chunks[-1]
        self.assertIn(last.finish_reason, ("STOP", "LENGTH"))
        self.assertTrue(all(c.finish_reason is None for c in chunks[:-1]))
        self.assertIsNotNone(last.usage)
        self.assertEqual(last.usage.completion_tokens, len(ids))
        self.assertGreater(last.usage.prompt_tokens, 0)
        self.assertLessEqual(len(ids), MAX_TOKENS)
        self.assertTrue(py_text)

        flags = ["--prompt=" + PROMPT, "--max_tokens=%d" % MAX_TOKENS, "--temperature=0"]
        r = self.cli("generate", *flags)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.one_line(r.stdout), py_text)
        self.assertIn("finish=" + last.finish_reason, r.stderr)
        self.assertIn("completion_tokens=%d" % len(ids), r.stderr)
        self.assertIn("tok/s", r.stderr)

        offline = self.cli_ok("generate", "--offline", *flags, server=False)
        self.assertEqual(self.one_line(offline), py_text)

        # The same prompt as token ids gives the same completion.
        prompt_ids = self.client.tokenize(PROMPT).token_ids
        self.assertEqual(self.client.generate_text(prompt_token_ids=prompt_ids,
                                                   max_tokens=MAX_TOKENS, temperature=0.0),
                         py_text)
        by_ids = self.cli_ok("generate", "--prompt_ids=" + ",".join(map(str, prompt_ids)),
                             "--max_tokens=%d" % MAX_TOKENS, "--temperature=0")
        self.assertEqual(self.one_line(by_ids), py_text)

    def test_seeded_sampling_is_reproducible(self):
        params = dict(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=7)
        self.assertEqual(self.client.generate_text(PROMPT, **params),
                         self.client.generate_text(PROMPT, **params))

    def test_max_tokens_is_respected(self):
        chunks = list(self.client.generate(PROMPT, max_tokens=3, temperature=0.0,
                                           ignore_eos=True))
        self.assertEqual(sum(len(c.token_ids) for c in chunks), 3)
        self.assertEqual(chunks[-1].finish_reason, "LENGTH")

    def test_sparse_request_returns_kv_stats(self):
        chunks = list(self.client.generate(LONG_PROMPT, max_tokens=16, temperature=0.0,
                                           ignore_eos=True, sparse_mode="sparse"))
        self.assertTrue(all(c.kv_stats is None for c in chunks[:-1]))
        stats = chunks[-1].kv_stats
        self.assertIsNotNone(stats)
        self.assertTrue(stats.sparse)
        self.assertEqual(stats.budget_tokens, SPARSE_BUDGET)
        self.assertGreater(stats.pages_hit + stats.pages_missed, 0)
        self.assertGreaterEqual(stats.hit_rate, 0.0)
        self.assertLessEqual(stats.hit_rate, 1.0)
        self.assertGreaterEqual(stats.stall_seconds, 0.0)

        # The request's own budget, and dense on request.
        last = list(self.client.generate(LONG_PROMPT, max_tokens=4, temperature=0.0,
                                         sparse_mode="sparse", budget_tokens=64))[-1]
        self.assertEqual(last.kv_stats.budget_tokens, 64)
        last = list(self.client.generate(LONG_PROMPT, max_tokens=4, temperature=0.0,
                                         sparse_mode="dense"))[-1]
        self.assertFalse(last.kv_stats.sparse)
        with self.assertRaises(ValueError):
            self.client.generate(PROMPT, sparse_mode="sometimes")

        r = self.cli("generate", "--prompt=" + LONG_PROMPT, "--max-tokens=8", "--temperature=0",
                     "--sparse-mode=sparse", "--budget-tokens=%d" % SPARSE_BUDGET)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("kv_stats sparse=true budget_tokens=%d " % SPARSE_BUDGET, r.stderr)
        self.assertIn("hit_rate=", r.stderr)
        r = self.cli("generate", "--prompt=" + PROMPT, "--sparse-mode=sometimes")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--sparse-mode", r.stderr)

        info = self.client.model_info()
        self.assertTrue(info.sparse.enabled)
        self.assertEqual(info.sparse.budget_tokens, SPARSE_BUDGET)
        self.assertRegex(self.cli_ok("info"), r"(?m)^sparse_enabled:\s+true$")

    # --- sessions -------------------------------------------------------------------------

    def test_session_turns_reuse_kv_from_both_clients(self):
        first = list(self.client.generate(LONG_PROMPT, max_tokens=8, temperature=0.0,
                                          ignore_eos=True, session_id="py-agent"))[-1]
        self.assertEqual(first.usage.cached_prompt_tokens, 0)
        sessions = {s.session_id: s for s in self.client.list_sessions()}
        self.assertIn("py-agent", sessions)
        self.assertGreater(sessions["py-agent"].cached_tokens, 0)
        self.assertFalse(sessions["py-agent"].running)
        # The next turn through the CLI: the same prompt plus more text reuses the first turn.
        r = self.cli("generate", "--prompt=" + LONG_PROMPT + " And then?", "--max-tokens=4",
                     "--temperature=0", "--session-id=py-agent")
        self.assertEqual(r.returncode, 0, r.stderr)
        cached = int(re.search(r"cached_prompt_tokens=(\d+)", r.stderr).group(1))
        self.assertGreater(cached, 0)
        self.assertRegex(self.cli_ok("sessions"), r"(?m)^py-agent\t\d+\t")
        self.assertIn("deleted py-agent", self.cli_ok("delete-session", "--session-id=py-agent"))
        with self.assertRaises(grpc.RpcError) as e:
            self.client.delete_session("py-agent")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        r = self.cli("delete-session", "--session-id=no such")
        self.assertEqual(r.returncode, 2, r.stderr)

    # --- tokenizer ------------------------------------------------------------------------

    def test_tokenize_detokenize_round_trip(self):
        text = "Hello, world! specula streams tokens."
        toks = self.client.tokenize(text, add_special_tokens=False)
        self.assertTrue(toks.token_ids)
        self.assertEqual(len(toks.tokens), len(toks.token_ids))
        self.assertEqual(self.client.detokenize(toks.token_ids), text)

        out = self.cli_ok("tokenize", "--prompt=" + text, "--add_special_tokens=false")
        lines = out.splitlines()
        self.assertEqual(lines[0], ",".join(map(str, toks.token_ids)))
        self.assertEqual(len(lines), 1 + len(toks.token_ids))
        self.assertEqual(self.one_line(self.cli_ok("detokenize", "--prompt_ids=" + lines[0])),
                         text)

        # Special tokens the tokenizer adds come back out unless skipped.
        with_special = self.client.tokenize(text).token_ids
        self.assertEqual(self.client.detokenize(with_special, skip_special_tokens=True), text)
        skipped = self.cli_ok("detokenize", "--skip_special_tokens",
                              "--prompt_ids=" + ",".join(map(str, with_special)))
        self.assertEqual(self.one_line(skipped), text)

    # --- model info and health ------------------------------------------------------------

    def test_model_info(self):
        info = self.client.model_info()
        self.assertGreater(info.vocab_size, 0)
        self.assertGreater(info.num_layers, 0)
        self.assertGreater(info.num_attention_heads, 0)
        self.assertGreater(info.num_key_value_heads, 0)
        self.assertGreater(info.hidden_size, 0)
        self.assertGreater(info.max_context_tokens, 0)
        self.assertTrue(info.architecture)
        self.assertTrue(info.device)
        out = self.cli_ok("info")
        self.assertRegex(out, r"(?m)^vocab_size:\s+%d$" % info.vocab_size)
        self.assertRegex(out, r"(?m)^num_layers:\s+%d$" % info.num_layers)
        self.assertRegex(out, r"(?m)^architecture:\s+%s$" % info.architecture)

    def test_health_serving(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("specula.v1.Specula"), "SERVING")
        self.assertEqual(self.cli_ok("health"), "SERVING\n")
        self.assertEqual(self.cli_ok("health", "--service=specula.v1.Specula"), "SERVING\n")
        r = self.cli("health", "--service=no.such.Service")
        self.assertNotEqual(r.returncode, 0)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.health("no.such.Service")
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_health_wire_format(self):
        from specula_client import _health
        self.assertEqual(_health.encode_request(""), b"")
        self.assertEqual(_health.encode_request("a.B"), b"\x0a\x03a.B")
        self.assertEqual(_health.decode_response(b""), "UNKNOWN")
        self.assertEqual(_health.decode_response(b"\x08\x02"), "NOT_SERVING")
        # Unknown fields of every wire type are skipped.
        self.assertEqual(_health.decode_response(b"\x12\x02ab\x19" + b"\0" * 8 + b"\x25" +
                                                 b"\0" * 4 + b"\x08\x01"), "SERVING")

    # grpcio-reflection is not packaged in Debian, and the request is tiny to write by hand:
    # ServerReflectionRequest{list_services: "*"} is field 7, a 1-byte string.
    REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

    def test_reflection_lists_the_services(self):
        # This server's config sets server.reflection: true.
        with grpc.insecure_channel(self.address) as channel:
            responses = list(channel.stream_stream(self.REFLECTION)(iter([b"\x3a\x01*"]),
                                                                    timeout=30))
        self.assertEqual(len(responses), 1)
        self.assertIn(b"specula.v1.Specula", responses[0])
        self.assertIn(b"grpc.health.v1.Health", responses[0])

    def test_reflection_is_off_by_default(self):
        # It lists the API to anyone, token or not: a server answers it only when configured to.
        ready = os.path.join(self.tmp, "ready-default.json")
        with open(os.path.join(self.tmp, "default.log"), "wb") as log:
            server = subprocess.Popen(
                [SERVER, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--ready-file", ready,
                 "--device", "cpu"], stdout=log, stderr=subprocess.STDOUT, env=self.env)
            try:
                deadline = time.monotonic() + READY_TIMEOUT_S
                while not os.path.exists(ready):
                    self.assertIsNone(server.poll(), "the default server exited")
                    self.assertLess(time.monotonic(), deadline, "the default server never got ready")
                    time.sleep(0.05)
                with open(ready) as f:
                    address = json.load(f)["listen"]
                with grpc.insecure_channel(address) as channel:
                    with self.assertRaises(grpc.RpcError) as cm:
                        list(channel.stream_stream(self.REFLECTION)(iter([b"\x3a\x01*"]),
                                                                    timeout=30))
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
            finally:
                server.kill()
                server.wait()

    # --- errors ---------------------------------------------------------------------------

    def test_bad_request_is_invalid_argument(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.generate_text(PROMPT, temperature=-1.0)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("temperature", cm.exception.details())

        r = self.cli("generate", "--prompt=" + PROMPT, "--temperature=-1")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("INVALID_ARGUMENT", r.stderr)

        vocab = self.client.model_info().vocab_size
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.generate_text(prompt_token_ids=[vocab + 5], max_tokens=2)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)

    def test_deadline_exceeded(self):
        info = self.client.model_info()
        long_run = dict(max_tokens=max(1, info.max_context_tokens - 64), ignore_eos=True,
                        temperature=0.0)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.generate_text(PROMPT, timeout=0.001, **long_run)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)

        r = self.cli("generate", "--prompt=" + PROMPT, "--timeout=0.001", "--ignore_eos",
                     "--max_tokens=%d" % long_run["max_tokens"])
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("DEADLINE_EXCEEDED", r.stderr)
        # The abandoned requests must not wedge the server.
        self.assertTrue(self.client.generate_text(PROMPT, max_tokens=2, temperature=0.0,
                                                  ignore_eos=True))

    def test_unreachable_server_fails(self):
        r = self.cli("health", "--server=127.0.0.1:1", "--timeout=5", server=False)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("UNAVAILABLE", r.stderr)

    # --- shutdown (runs last: unittest orders tests by name) -------------------------------

    def test_zz_sigterm_drains_and_exits_zero(self):
        self.assertEqual(self.client.health(), "SERVING")
        self.server.send_signal(signal.SIGTERM)
        try:
            code = self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("specula-server did not exit within 60 s of SIGTERM:\n" + self._server_log())
        self.assertEqual(code, 0, self._server_log())


if __name__ == "__main__":
    unittest.main()
