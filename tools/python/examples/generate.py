#!/usr/bin/env python3
"""Streams a completion from a running specula server.

    .venv/bin/python tools/python/examples/generate.py --server 127.0.0.1:50051 \
        --prompt "Hello" --max-tokens 32 --temperature 0

Needs the specula-client package (README.md: pip install ./tools/python into a venv made from
Debian's python3 with --system-site-packages, which brings grpcio and protobuf).
"""

import argparse
import sys

import grpc

from specula_client import SpeculaClient


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:50051", help="HOST:PORT")
    parser.add_argument("--prompt", default="Hello, specula!")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    args = parser.parse_args()

    with SpeculaClient(args.server, timeout=args.timeout) as client:
        try:
            last = None
            for chunk in client.generate(args.prompt, max_tokens=args.max_tokens,
                                         temperature=args.temperature):
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
                last = chunk
            sys.stdout.write("\n")
        except grpc.RpcError as e:
            print(f"\nerror: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    if last is not None and last.usage is not None:
        print(f"finish={last.finish_reason} prompt_tokens={last.usage.prompt_tokens} "
              f"completion_tokens={last.usage.completion_tokens}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
