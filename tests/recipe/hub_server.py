"""A stand-in for the Hugging Face Hub on 127.0.0.1, for the download tests (tests may not reach the internet).

It answers the few routes huggingface_hub's snapshot_download uses for a pinned commit, as the Hub does: the
repository tree (`/api/models/<repo>/tree/<commit>`), and `HEAD`/`GET` of `/<repo>/resolve/<commit>/<path>`
with the Hub's headers (X-Repo-Commit, ETag = the blob's sha256, Content-Length; GET honours `Range`, so an
interrupted download resumes). The client is the real huggingface_hub; only the server is ours. Every request is
recorded (`requests`) and a transfer can be cut after a number of bytes (`cut_after`) to interrupt a download.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(self, repo: str, commit: str, files: dict[str, bytes]) -> None:
        self.repo, self.commit, self.files = repo, commit, files
        self.requests: list[str] = []
        self.cut_after: int | None = None  # the next large GET stops after this many bytes (once)
        self.bytes_sent = 0
        self.advertised_size: dict[str, int] = {}  # a size the tree and HEAD claim instead of the real one
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def _tree(self) -> list[dict]:
        return [
            {
                "type": "file",
                "path": path,
                "size": self.advertised_size.get(path, len(data)),
                "oid": hashlib.sha1(data).hexdigest(),
                "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
            }
            for path, data in sorted(self.files.items())
        ]

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        self.requests.append(f"{handler.command} {path}")
        tree_prefix = f"/api/models/{self.repo}/tree/{self.commit}"
        resolve_prefix = f"/{self.repo}/resolve/{self.commit}/"
        if path.rstrip("/") == tree_prefix:
            self._send(handler, 200, json.dumps(self._tree()).encode(), {"Content-Type": "application/json"}, body)
        elif path.startswith(resolve_prefix) and path[len(resolve_prefix) :] in self.files:
            self._file(handler, path[len(resolve_prefix) :], body)
        elif path.startswith(f"/api/models/{self.repo}/") or path.startswith(f"/{self.repo}/resolve/"):
            self._send(
                handler,
                404,
                b'{"error":"Revision Not Found"}',
                {"X-Error-Code": "RevisionNotFound", "Content-Type": "application/json"},
                body,
            )
        else:
            self._send(
                handler,
                404,
                b'{"error":"Repository Not Found"}',
                {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"},
                body,
            )

    def _file(self, handler: BaseHTTPRequestHandler, name: str, body: bool) -> None:
        data = self.files[name]
        headers = {
            "X-Repo-Commit": self.commit,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start = 0
        wanted = handler.headers.get("Range", "")
        if wanted.startswith("bytes=") and body:
            start = int(wanted[6:].split("-")[0] or 0)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if not body and name in self.advertised_size:
            headers["X-Linked-Size"] = str(self.advertised_size[name])
        self._send(handler, 206 if start else 200, data[start:], headers, body)

    def _send(
        self, handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str], body: bool
    ) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if not body:
            return
        if self.cut_after is not None and len(data) > self.cut_after:
            cut, self.cut_after = self.cut_after, None
            handler.wfile.write(data[:cut])
            self.bytes_sent += cut
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(2)
            return
        handler.wfile.write(data)
        self.bytes_sent += len(data)
