#!/usr/bin/python3
"""Soak run (issue 15; not in CI): mixed load on a real specula-server for a long time, sampling
the server's resident memory, to show that nothing accumulates.

Starts `specula-server` (the embedded default model unless --model is given) with the sparse KV
cache on, then runs --workers client threads for --minutes. Each worker loops over a mix:
dense and sparse generations of varied length, multi-turn sessions (deleted at the end of each
conversation), requests cancelled after their first tokens, requests whose deadline passes,
tokenize calls. Every --sample seconds it records the server's VmRSS (from /proc) and the
engine's KV gauges (from /metrics). At the end it writes the curve as CSV and checks:
  - RSS growth after minute 10 (or after the first third of a shorter run) < --max-growth-mb;
  - the KV gauges return to 0 once the load stops.
Exit status 0 when both hold.

    PYTHONPATH=build/python /usr/bin/python3 tools/soak.py \\
        --server build/server/specula-server --minutes 60 --csv soak.csv
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
from specula_client import SpeculaClient

CONFIG = """
sparse:
  enabled: true
  budget_tokens: 64
  sink_tokens: 16
  recent_tokens: 32
  min_context_tokens: 100000
  host_capacity_tokens: 65536
kv_cache:
  session_ttl_seconds: 60
"""
WORDS = "the quick brown fox jumps over the lazy dog while agents call tools and read".split()


def start_server(args, tmp):
    config = os.path.join(tmp, "soak.yaml")
    with open(config, "w") as f:
        f.write(CONFIG)
    ready = os.path.join(tmp, "ready.json")
    cmd = [args.server, "--config", config, "--listen", "127.0.0.1:0", "--metrics-listen",
           "127.0.0.1:0", "--ready-file", ready, "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(
        os.path.join(tmp, "server.log"), "wb"))
    deadline = time.monotonic() + 300
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("specula-server did not start; see %s/server.log" % tmp)
        time.sleep(0.1)
    with open(ready) as f:
        return proc, json.load(f)


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        m = re.search(r"VmRSS:\s+(\d+) kB", f.read())
    return int(m.group(1)) * 1024


def gauges(metrics_address):
    text = urllib.request.urlopen("http://%s/metrics" % metrics_address, timeout=10).read()
    out = {}
    for name in ("specula_kv_cache_blocks_used", "specula_kv_host_pages_used",
                 "specula_num_requests_running", "specula_num_requests_waiting", "specula_sessions"):
        m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.e+-]+)$" % name, text.decode(), re.M)
        out[name] = float(m.group(1)) if m else float("nan")
    return out


def prompt(rng, words):
    return " ".join(rng.choice(WORDS) for _ in range(words))


def one_task(client, rng, worker, n):
    kind = rng.randrange(10)
    try:
        if kind < 4:  # plain generation, dense or sparse
            sparse = "sparse" if kind == 3 else "default"
            client.generate_text(prompt(rng, rng.randrange(5, 400)),
                                 max_tokens=rng.randrange(1, 64), temperature=0, ignore_eos=True,
                                 sparse_mode=sparse)
        elif kind < 6:  # a short conversation kept in a session, then deleted
            session = "soak-%d-%d" % (worker, n)
            history = prompt(rng, 50)
            for _ in range(rng.randrange(2, 5)):
                history += " " + prompt(rng, rng.randrange(5, 60))
                history += client.generate_text(history, max_tokens=16, temperature=0,
                                                session_id=session)
            client.delete_session(session)
        elif kind == 6:  # cancelled after its first tokens
            stream = client.generate(prompt(rng, 100), max_tokens=2000, ignore_eos=True)
            next(stream)
            stream.close()  # closing the iterator cancels the call
        elif kind == 7:  # deadline passes
            try:
                client.generate_text(prompt(rng, 100), max_tokens=3000, ignore_eos=True,
                                     timeout=0.2)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
        else:
            client.tokenize(prompt(rng, rng.randrange(1, 1000)))
    except grpc.RpcError as e:
        # Overload answers are part of a soak; anything else is a finding.
        if e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED):
            return True
        print("worker %d: %s %s" % (worker, e.code(), e.details()), file=sys.stderr)
        return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--sample", type=float, default=10, help="seconds between samples")
    ap.add_argument("--csv", default="soak.csv")
    ap.add_argument("--max-growth-mb", type=float, default=100)
    args = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="specula_soak_")
    proc, addresses = start_server(args, tmp)
    stop = threading.Event()
    counts = [0] * args.workers
    errors = [0] * args.workers

    def worker(i):
        rng = random.Random(i)
        with SpeculaClient(addresses["listen"], timeout=120) as client:
            while not stop.is_set():
                if not one_task(client, rng, i, counts[i]):
                    errors[i] += 1
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(args.workers)]
    for t in threads:
        t.start()
    start = time.monotonic()
    samples = []
    with open(args.csv, "w") as out:
        out.write("minute,rss_mb,kv_blocks_used,host_pages_used,running,waiting,sessions,tasks\n")
        while time.monotonic() - start < args.minutes * 60:
            time.sleep(args.sample)
            minute = (time.monotonic() - start) / 60
            g = gauges(addresses["metrics_listen"])
            rss = rss_bytes(proc.pid) / 2**20
            samples.append((minute, rss))
            out.write("%.2f,%.1f,%d,%d,%d,%d,%d,%d\n" % (
                minute, rss, g["specula_kv_cache_blocks_used"], g["specula_kv_host_pages_used"],
                g["specula_num_requests_running"], g["specula_num_requests_waiting"],
                g["specula_sessions"], sum(counts)))
            out.flush()
    stop.set()
    for t in threads:
        t.join(timeout=180)
    time.sleep(2)
    final = gauges(addresses["metrics_listen"])
    proc.terminate()
    proc.wait(timeout=60)

    settle = min(10.0, args.minutes / 3)
    after = [rss for minute, rss in samples if minute >= settle]
    growth = max(after) - after[0] if after else float("nan")
    leftover = {k: v for k, v in final.items() if k != "specula_sessions" and v != 0}
    print("%d tasks in %.1f min; RSS %.1f MB at minute %.1f, max %.1f MB after: growth %.1f MB"
          % (sum(counts), args.minutes, after[0] if after else float("nan"), settle,
             max(after) if after else float("nan"), growth))
    print("after the load: %s" % final)
    ok = growth < args.max_growth_mb and not leftover and sum(errors) == 0
    if sum(errors):
        print("%d tasks failed with an unexpected status (above)" % sum(errors))
    if leftover:
        print("KV or requests still held after the load: %s" % leftover)
    print("soak %s; curve in %s" % ("passed" if ok else "FAILED", args.csv))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
