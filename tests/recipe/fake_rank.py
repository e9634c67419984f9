"""A stand-in for `python -m engine serve` in process-management tests (the real engine is used end to end).

Takes the same flags; rank 0 serves GET /health and POST /v1/chat/completions on --host/--port. Behaviour knobs
come from the environment: FAKE_REPLY (reply text), FAKE_RUNNING (requests_running), FAKE_EXIT (exit with this
code after printing a line), FAKE_IGNORE_TERM=1 (survive SIGTERM), FAKE_DELAY (seconds before listening).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LIFETIME_S = 300


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        running = int(os.environ.get("FAKE_RUNNING", "0"))
        self._send({"busy": running > 0, "requests_running": running, "context_length": 4096})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        reply = os.environ.get("FAKE_REPLY", "OK")
        self._send(
            {"choices": [{"message": {"role": "assistant", "content": reply}}], "usage": {"completion_tokens": 2}}
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    print(f"fake rank {args.rank} loading {args.checkpoint}", flush=True)
    if os.environ.get("FAKE_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "FAKE_EXIT" in os.environ and args.rank == int(os.environ.get("FAKE_EXIT_RANK", "1")):
        print(f"fake rank {args.rank}: failing on purpose", flush=True)
        return int(os.environ["FAKE_EXIT"])
    time.sleep(float(os.environ.get("FAKE_DELAY", "0")))
    if args.rank == 0:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print("fake rank 0 ready", flush=True)
    time.sleep(LIFETIME_S)  # a leaked fake never outlives this
    return 0


if __name__ == "__main__":
    sys.exit(main())
