"""A local HTTP server for the fetch tests (tests/test_fetch.py, tests/test_textdata.py,
tests/test_credentials.py): it serves files from memory with Range support, can hang up mid-file or
ignore Range, can ask for a login (401), refuse (403) or redirect (302) like a private mirror, and
records every request; and the fast retry settings the tests fetch with."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAST = {"timeout_s": 5.0, "retries": 2, "backoff_s": 0.0}
NAME = "cifar-10-python.tar.gz"  # what the server serves by default


@dataclass
class Served:
    path: str
    range: str | None
    status: int
    sent: int = 0
    authorization: str | None = None


@dataclass
class FileServer:
    """Serves `files` with Range support; can hang up after some bytes or ignore Range headers."""

    files: dict[str, bytes]
    requests: list[Served] = field(default_factory=list)
    hang_up_after: list[int] = field(default_factory=list)  # per coming response: body bytes to send
    ignore_range: bool = False
    login: str | None = None  # the Authorization header a request needs (else 401), as a private mirror
    forbidden: bool = False  # every request answered 403
    redirect_to: str | None = None  # every request answered 302 to this URL
    port: int = 0

    def url(self, name: str = NAME) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


class _Handler(BaseHTTPRequestHandler):
    server: ThreadingHTTPServer

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        state: FileServer = self.server.state  # type: ignore[attr-defined]
        body = state.files.get(self.path.lstrip("/"))
        requested = self.headers.get("Range")
        start = _range_start(requested) if requested and not state.ignore_range else 0
        status = 404 if body is None else 416 if start >= len(body) > 0 else 206 if start else 200
        authorization = self.headers.get("Authorization")
        if state.login is not None and authorization != state.login:
            status = 401
        status = 403 if state.forbidden else 302 if state.redirect_to else status
        served = Served(self.path, requested, status, authorization=authorization)
        state.requests.append(served)
        if status in (401, 403, 404):
            self.send_response(status)
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="mirror"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if status == 302:
            self.send_response(302)
            self.send_header("Location", state.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(status)
        if status == 416:
            self.send_header("Content-Range", f"bytes */{len(body)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        payload = body[start:]
        if state.hang_up_after:
            payload = payload[: state.hang_up_after.pop(0)]
        # recorded before the write: a client that has read every byte may return (and its test
        # read the record) before this thread runs another line
        served.sent = len(payload)
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def _range_start(header: str) -> int:
    match = re.fullmatch(r"bytes=(\d+)-", header)
    assert match, header
    return int(match.group(1))


@contextlib.contextmanager
def serving(files: dict[str, bytes]) -> Iterator[FileServer]:
    """A FileServer of `files` on 127.0.0.1 (a free port) while the block runs."""
    state = FileServer(files)
    with http_server(_Handler) as httpd:
        httpd.state = state  # type: ignore[attr-defined]
        state.port = httpd.server_address[1]
        yield state


@contextlib.contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """An HTTP server of `handler` on 127.0.0.1 (a free port), serving in a thread while the block runs."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
