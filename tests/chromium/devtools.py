"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages ending in a NUL byte, Chromium reading fd 3 and writing fd 4), with the standard library
only: open a page, wait for a text, run a script in it (a click), take a screenshot. For the UI tests
that need more than `--dump-dom` (the MLflow runs table's nested runs open on a click)."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

# Chromium without a display, a sandbox, a GPU or its own network traffic (every test's Chromium)
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
FLAGS = [*HEADLESS, "--remote-debugging-pipe"]


class Page:
    """One Chromium with one page; use as a context manager."""

    def __init__(self, chromium: str, profile: Path, width: int = 1600, height: int = 1200):
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        # above the numbers 3 and 4, so that moving them there in the child clobbers neither
        to_chrome, from_chrome = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_chrome, from_chrome))

        def in_child():
            os.dup2(to_chrome, 3)
            os.dup2(from_chrome, 4)

        command = [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        self.process = subprocess.Popen(
            command,
            pass_fds=(3, 4),
            preexec_fn=in_child,  # noqa: PLW1509 - only dup2 before exec
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (to_chrome, from_chrome):
            os.close(fd)
        self._buffer, self._next, self.session = b"", 0, None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *_) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self._write)
        os.close(self._read)

    def call(self, method: str, timeout_s: float = 60, **params) -> dict:
        """One DevTools command; its result (an error raises)."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = self._message()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(f"{method}: no answer in {timeout_s} s")

    def _message(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def evaluate(self, script: str):
        """The value of a JavaScript expression in the page."""
        result = self.call("Runtime.evaluate", expression=script, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def open(self, url: str, *wanted: str, timeout_s: float = 120) -> str:
        """Loads `url` and waits until the page's text holds every `wanted`; the text."""
        self.call("Page.navigate", url=url)
        return self.wait_for(*wanted, timeout_s=timeout_s)

    def wait_for(self, *wanted: str, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(item in text for item in wanted) or time.monotonic() > deadline:
                return text
            time.sleep(0.5)

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path
