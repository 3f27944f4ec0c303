"""End-to-end test of TLS, mutual TLS and bearer tokens on the real server (issue 15).

Makes two certificate authorities with the openssl CLI, starts `specula-server` (embedded default
model) with server.tls and server.auth, and calls it as users do: the Python client
(specula_client, i.e. grpcio), specula-cli, and Python's own ssl + http.client against the
OpenAI HTTP listener. Checks that good credentials pass and that a plaintext client, a client
trusting the wrong CA, a missing or foreign client certificate and a missing token are refused
with the documented code; that health answers without a token; that a rotated certificate is
served without a restart; and that a key not matching its certificate stops the server at start.

Environment (CTest sets it): SPECULA_SERVER, SPECULA_CLI and PYTHONPATH=<build>/python.
"""

import http.client
import json
import os
import resource
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import unittest

import grpc
from specula_client import SpeculaClient

SERVER = os.environ["SPECULA_SERVER"]
CLI = os.environ["SPECULA_CLI"]
READY_TIMEOUT_S = 120
ROTATION_TIMEOUT_S = 30
TOKEN = "tls-test-token-0123456789abcdef"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """Two CAs; server and client certificates issued by either."""

    def __init__(self, directory):
        self.dir = directory
        for ca in ("ca1", "ca2"):
            openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2",
                    "-subj", "/CN=specula test " + ca, "-addext",
                    "basicConstraints=critical,CA:TRUE", "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
        for ca in ("ca1", "ca2"):
            self._issue("server-" + ca, ca, "serverAuth",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1")
            self._issue("client-" + ca, ca, "clientAuth", None)

    def _issue(self, name, ca, usage, san):
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name,
                cwd=self.dir)
        ext = "extendedKeyUsage=%s\n" % usage + (san + "\n" if san else "")
        with open(os.path.join(self.dir, name + ".ext"), "w") as f:
            f.write(ext)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", "-extfile", name + ".ext",
                cwd=self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)


class RunningServer:
    def __init__(self, tmp, config_text, name, open_files=None):
        self.tmp = tmp
        ready = os.path.join(tmp, name + ".ready.json")
        config = os.path.join(tmp, name + ".yaml")
        with open(config, "w") as f:
            f.write(config_text)
        self.log_path = os.path.join(tmp, name + ".log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [SERVER, "--config", config, "--listen", "127.0.0.1:0", "--metrics-listen", "",
             "--http-listen", "127.0.0.1:0", "--ready-file", ready, "--device", "cpu"],
            stdout=self.log, stderr=subprocess.STDOUT,
            # Soft and hard: the server raises its soft limit to the hard one at start.
            preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                   (open_files, open_files)))
            if open_files else None)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(ready):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("specula-server did not start:\n" + self.output())
            time.sleep(0.05)
        with open(ready) as f:
            addresses = json.load(f)
        self.grpc = addresses["listen"]
        self.http_port = int(addresses["http_listen"].rsplit(":", 1)[1])

    def output(self, tail=4000):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            text = f.read().decode(errors="replace")
        return text[-tail:] if tail else text

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def tls_config(pki, client_ca=None):
    text = """
server:
  auth:
    token_file: %s
  tls:
    cert_file: %s
    key_file: %s
    reload_seconds: 1
""" % (pki.path("tokens"), pki.path("served.pem"), pki.path("served.key"))
    if client_ca:
        text += "    client_ca_file: %s\n" % pki.path(client_ca)
    return text


def https_get(port, path, ca, cert=None, token=None):
    """(status, body) of GET over HTTPS trusting `ca`, with a client certificate if given."""
    context = ssl.create_default_context(cafile=ca)
    if cert:
        context.load_cert_chain(cert + ".pem", cert + ".key")
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": "Bearer " + token} if token else {})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def grpc_code(call):
    try:
        call()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


class TlsTestBase(unittest.TestCase):
    @classmethod
    def make_pki(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specula_tls_")
        cls.pki = Pki(cls.tmp)
        with open(cls.pki.path("tokens"), "w") as f:
            f.write(TOKEN + "\n")
        shutil.copy(cls.pki.path("server-ca1.pem"), cls.pki.path("served.pem"))
        shutil.copy(cls.pki.path("server-ca1.key"), cls.pki.path("served.key"))

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def client(self, **kwargs):
        c = SpeculaClient(self.server.grpc, timeout=20, **kwargs)
        self.addCleanup(c.close)
        return c


class TlsE2ETest(TlsTestBase):
    """server.tls (no client CA) and server.auth; the last test rotates the certificate."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        cls.server = RunningServer(cls.tmp, tls_config(cls.pki), "tls")

    def test_grpc_with_the_ca_and_a_token_generates(self):
        c = self.client(ca_file=self.pki.path("ca1.pem"), token=TOKEN)
        self.assertTrue(c.generate_text("Hello", max_tokens=4))
        # Health needs TLS but no token (orchestrator probes).
        self.assertEqual(self.client(ca_file=self.pki.path("ca1.pem")).health(), "SERVING")

    def test_grpc_refuses_plaintext_the_wrong_ca_and_no_token(self):
        self.assertEqual(grpc_code(self.client().health), grpc.StatusCode.UNAVAILABLE)
        wrong_ca = self.client(ca_file=self.pki.path("ca2.pem"), token=TOKEN)
        self.assertEqual(grpc_code(wrong_ca.health), grpc.StatusCode.UNAVAILABLE)
        no_token = self.client(ca_file=self.pki.path("ca1.pem"))
        self.assertEqual(grpc_code(lambda: no_token.generate_text("Hello", max_tokens=2)),
                         grpc.StatusCode.UNAUTHENTICATED)

    def test_cli_over_tls_with_a_token_file(self):
        args = [CLI, "generate", "--server=" + self.server.grpc, "--prompt=Hello",
                "--max_tokens=3", "--ca_file=" + self.pki.path("ca1.pem")]
        r = subprocess.run(args + ["--token_file=" + self.pki.path("tokens")],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run(args, capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("UNAUTHENTICATED", r.stderr)

    def test_https_serves_health_and_asks_the_api_for_a_token(self):
        ca = self.pki.path("ca1.pem")
        self.assertEqual(https_get(self.server.http_port, "/health", ca)[0], 200)
        self.assertEqual(https_get(self.server.http_port, "/v1/models", ca)[0], 401)
        status, body = https_get(self.server.http_port, "/v1/models", ca, token=TOKEN)
        self.assertEqual(status, 200, body)

    def test_https_refuses_plaintext_and_the_wrong_ca(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
        with self.assertRaises((http.client.HTTPException, OSError)):
            conn.request("GET", "/health")
            conn.getresponse().read()
        conn.close()
        with self.assertRaises(ssl.SSLCertVerificationError):
            https_get(self.server.http_port, "/health", self.pki.path("ca2.pem"))

    def test_z_a_rotated_certificate_is_served_without_a_restart(self):
        # The key first: until the certificate follows, the pair does not match and the old one
        # stays in use.
        for ext in ("key", "pem"):
            tmp = self.pki.path("served.%s.new" % ext)
            shutil.copy(self.pki.path("server-ca2." + ext), tmp)
            os.replace(tmp, self.pki.path("served." + ext))
        ca2 = self.pki.path("ca2.pem")
        deadline = time.monotonic() + ROTATION_TIMEOUT_S
        grpc_ok = https_ok = False
        while time.monotonic() < deadline and not (grpc_ok and https_ok):
            if not grpc_ok:
                c = SpeculaClient(self.server.grpc, timeout=5, ca_file=ca2)
                grpc_ok = grpc_code(c.health) == grpc.StatusCode.OK
                c.close()
            if not https_ok:
                try:
                    https_ok = https_get(self.server.http_port, "/health", ca2)[0] == 200
                except (ssl.SSLError, OSError):
                    pass
            time.sleep(0.2)
        self.assertTrue(grpc_ok, "gRPC never served the new certificate:\n" + self.server.output())
        self.assertTrue(https_ok, "HTTP never served the new certificate:\n" + self.server.output())
        # New connections trusting only the old CA fail now.
        self.assertEqual(grpc_code(self.client(ca_file=self.pki.path("ca1.pem")).health),
                         grpc.StatusCode.UNAVAILABLE)
        with self.assertRaises(ssl.SSLCertVerificationError):
            https_get(self.server.http_port, "/health", self.pki.path("ca1.pem"))


class MutualTlsE2ETest(TlsTestBase):
    """server.tls.client_ca_file = ca1: clients need a certificate ca1 signed."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        cls.server = RunningServer(cls.tmp, tls_config(cls.pki, client_ca="ca1.pem"), "mtls")

    def test_grpc_needs_a_client_certificate_from_the_client_ca(self):
        ca = self.pki.path("ca1.pem")
        self.assertEqual(grpc_code(self.client(ca_file=ca).health), grpc.StatusCode.UNAVAILABLE)
        foreign = self.client(ca_file=ca, cert_file=self.pki.path("client-ca2.pem"),
                              key_file=self.pki.path("client-ca2.key"))
        self.assertEqual(grpc_code(foreign.health), grpc.StatusCode.UNAVAILABLE)
        good = self.client(ca_file=ca, cert_file=self.pki.path("client-ca1.pem"),
                           key_file=self.pki.path("client-ca1.key"), token=TOKEN)
        self.assertEqual(good.health(), "SERVING")
        self.assertTrue(good.generate_text("Hello", max_tokens=4))

    def test_https_needs_a_client_certificate_from_the_client_ca(self):
        ca, port = self.pki.path("ca1.pem"), self.server.http_port
        status, body = https_get(port, "/health", ca)
        self.assertEqual(status, 403, body)
        self.assertIn("client certificate", body)
        self.assertEqual(https_get(port, "/health", ca, cert=self.pki.path("client-ca2"))[0], 403)
        self.assertEqual(https_get(port, "/health", ca, cert=self.pki.path("client-ca1"))[0], 200)
        status, body = https_get(port, "/v1/models", ca, cert=self.pki.path("client-ca1"),
                                 token=TOKEN)
        self.assertEqual(status, 200, body)


class IntermediateClientCaTest(TlsTestBase):
    """client_ca_file holding only an intermediate CA: HTTPS trusts it as an anchor, as any CA
    in the bundle (OpenSSL would otherwise insist on a chain up to a self-signed root)."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        d = cls.tmp
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "int1.key", "-out", "int1.csr", "-subj", "/CN=specula test int1",
                cwd=d)
        with open(os.path.join(d, "int1.ext"), "w") as f:
            f.write("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
        openssl("x509", "-req", "-in", "int1.csr", "-CA", "ca1.pem", "-CAkey", "ca1.key",
                "-CAcreateserial", "-out", "int1.pem", "-days", "2", "-extfile", "int1.ext",
                cwd=d)
        cls.pki._issue("client-int1", "int1", "clientAuth", None)
        cls.server = RunningServer(cls.tmp, tls_config(cls.pki, client_ca="int1.pem"),
                                   "intermediate")

    def test_https_trusts_an_intermediate_client_ca(self):
        ca, port = self.pki.path("ca1.pem"), self.server.http_port
        status, body = https_get(port, "/health", ca, cert=self.pki.path("client-int1"))
        self.assertEqual(status, 200, body)
        # ca1 signed client-ca1 itself: not through the configured intermediate.
        self.assertEqual(https_get(port, "/health", ca, cert=self.pki.path("client-ca1"))[0], 403)


class TlsHandshakeTimeoutTest(TlsTestBase):
    """server.connections.grpc_handshake_seconds (issue 32): a connection that never finishes its
    TLS handshake is closed by the server; one that finished it is kept past that deadline."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        config = tls_config(cls.pki) + "  connections:\n    grpc_handshake_seconds: 1\n"
        cls.server = RunningServer(cls.tmp, config, "handshake")

    def test_a_silent_connection_is_closed_after_the_handshake_deadline(self):
        host, port = self.server.grpc.rsplit(":", 1)
        silent = socket.create_connection((host, int(port)), timeout=15)
        half = socket.create_connection((host, int(port)), timeout=15)
        half.sendall(b"\x16\x03\x01\x00\xc8")  # a TLS record header promising a ClientHello
        try:
            for s in (silent, half):
                start = time.monotonic()
                try:
                    self.assertEqual(s.recv(1), b"")  # the server closed it
                except ConnectionResetError:
                    pass
                self.assertLess(time.monotonic() - start, 10)
        finally:
            silent.close()
            half.close()

    def test_an_established_connection_outlives_the_handshake_deadline(self):
        c = self.client(ca_file=self.pki.path("ca1.pem"), token=TOKEN)
        self.assertTrue(c.generate_text("Hello", max_tokens=2))
        time.sleep(2)  # twice the handshake deadline, on the same channel
        self.assertTrue(c.generate_text("Hello", max_tokens=2))


class HttpsHeadDeadlineTest(TlsTestBase):
    """server.connections.http_request_read_seconds (issue 33): an HTTPS connection that drips its
    handshake (so it is never idle) is closed at the read deadline; a finished request on the
    same kind of connection is served."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        config = tls_config(cls.pki) + "  connections:\n    http_request_read_seconds: 1\n"
        cls.server = RunningServer(cls.tmp, config, "https_head")

    def test_a_dripped_handshake_is_cut_at_the_read_deadline(self):
        s = socket.create_connection(("127.0.0.1", self.server.http_port), timeout=10)
        s.settimeout(0.2)
        try:
            s.sendall(b"\x16\x03\x01\x02\x00")  # a record header promising a 512-byte hello
            start, closed = time.monotonic(), False
            while not closed and time.monotonic() - start < 8:
                try:
                    s.sendall(b"\x00")
                    closed = s.recv(1) == b""
                except socket.timeout:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    closed = True
            self.assertTrue(closed, "still open after 8 s of dripping")
            self.assertGreaterEqual(time.monotonic() - start, 0.8)
        finally:
            s.close()
        status, body = https_get(self.server.http_port, "/health", self.pki.path("ca1.pem"))
        self.assertEqual(status, 200, body)


class TlsListenerFailureTest(TlsTestBase):
    """With TLS the gRPC listener is gRPC's own, which stops accepting for good after one failed
    accept (issue 32; plaintext has specula's own listener, which recovers: see
    FdExhaustionE2eTest). The server must take its fatal path, not answer health ok while
    nobody can connect."""

    @classmethod
    def setUpClass(cls):
        cls.make_pki()
        cls.server = RunningServer(cls.tmp, tls_config(cls.pki), "fd", open_files=200)

    def test_descriptor_exhaustion_takes_the_fatal_path(self):
        host, port = self.server.grpc.rsplit(":", 1)
        held = []
        try:
            for _ in range(250):  # more than the 200 descriptors the server may open
                try:
                    held.append(socket.create_connection((host, int(port)), timeout=10))
                except (ConnectionResetError, ConnectionRefusedError):
                    break  # the server took its fatal path while this connection was made
            code = self.server.proc.wait(timeout=60)
        finally:
            for s in held:
                s.close()
        log = self.server.output(tail=None)
        self.assertEqual(code, 1, log[-4000:])
        self.assertIn("Failed accept4", log)
        self.assertIn("event=fatal cause=grpc_listener_failed", log)
        self.assertIn("event=stopped", log)


class TlsStartupTest(unittest.TestCase):
    def test_a_key_that_is_not_the_certificates_stops_the_server(self):
        tmp = tempfile.mkdtemp(prefix="specula_tls_bad_")
        self.addCleanup(shutil.rmtree, tmp, True)
        pki = Pki(tmp)
        config = os.path.join(tmp, "bad.yaml")
        with open(config, "w") as f:
            f.write("server:\n  tls:\n    cert_file: %s\n    key_file: %s\n"
                    % (pki.path("server-ca1.pem"), pki.path("server-ca2.key")))
        r = subprocess.run([SERVER, "--config", config, "--listen", "127.0.0.1:0",
                            "--metrics-listen", "", "--device", "cpu"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("server.tls.key_file", r.stderr)
        self.assertIn("is not the key of the certificate", r.stderr)


if __name__ == "__main__":
    unittest.main()
