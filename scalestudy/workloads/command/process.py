"""The user's script as a process tree that ends with its rank (scalestudy.workloads.command.runner).

- Its own process group (setsid): the script's children (data workers, a helper server) are in
  it, so one killpg reaches the whole tree.
- The script dies with the runner (PR_SET_PDEATHSIG), and a reaper outlives the runner to kill the
  rest: a small process of its own session, holding the read end of a pipe whose write end only
  the runner holds. When the runner ends, however it ends (SIGKILL by torchrun's agent or the
  kernel included), the pipe closes and the reaper SIGKILLs the script's process group. A runner
  that ends normally closes the pipe after the script has exited: what the script left running
  goes too. (A child that starts a session of its own escapes the group; under Slurm the job's
  cgroup still ends it.)
- A stop signal (SIGTERM/SIGUSR1) is forwarded to the script; if the script is still running
  STOP_GRACE_S later (SCALESTUDY_STOP_GRACE_S overrides it), the whole group is SIGKILLed. 20 s by
  default: inside the 30 s that Slurm's default KillWait and torchrun's agent give the rank.
- The script's stderr passes through to the runner's, and its last lines are kept for the log.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from scalestudy.launch import distributed

STOP_GRACE_S = 20.0
GRACE_ENV = "SCALESTUDY_STOP_GRACE_S"
TAIL_LINES = 20
REAPER = """
import os, signal, sys
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, signal.SIG_IGN)
sys.stdin.buffer.read()
try:
    os.killpg(int(sys.argv[1]), signal.SIGKILL)
except (ProcessLookupError, PermissionError):
    pass
"""

log = logging.getLogger("scalestudy.workloads.command")


def stop_grace_s(environ=None) -> float:
    """The grace after a stop signal: STOP_GRACE_S, or SCALESTUDY_STOP_GRACE_S (seconds > 0)."""
    value = (os.environ if environ is None else environ).get(GRACE_ENV)
    if value is None:
        return STOP_GRACE_S
    try:
        grace = float(value)
    except ValueError:
        grace = -1.0
    if not grace > 0:
        raise ValueError(f"{GRACE_ENV}={value!r} must be a number of seconds > 0")
    return grace


class ScriptProcess:
    """One rank's script: started in its own process group with a reaper, stderr teed."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], grace_s: float) -> None:
        self.grace_s = grace_s
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stop_at: float | None = None  # monotonic time of the first stop signal forwarded
        self.killed = False  # by the grace period's end
        self.closed = False
        self.child = subprocess.Popen(
            list(argv),
            env=env,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: killpg reaches its children
            preexec_fn=distributed.die_with_parent,  # a SIGKILLed runner leaves no script behind
        )
        self.reaper = subprocess.Popen(
            [sys.executable, "-S", "-c", REAPER, str(self.child.pid)],
            stdin=subprocess.PIPE,
            start_new_session=True,  # out of reach of signals to the rank's group
        )
        self.tee = threading.Thread(target=self._tee, daemon=True)
        self.tee.start()

    @property
    def pid(self) -> int:
        return self.child.pid

    def _tee(self) -> None:
        for line in iter(self.child.stderr.readline, b""):
            with contextlib.suppress(OSError):
                os.write(2, line)
            self.tail.append(line.decode("utf-8", "replace").rstrip("\n"))

    def signal(self, signum: int) -> None:
        """Forward a stop signal to the script (its children are its affair until the grace ends);
        the first one starts the grace period's timer."""
        if self.child.returncode is None:
            self.child.send_signal(signum)
            if self.stop_at is None:
                self.stop_at = time.monotonic()
                timer = threading.Timer(self.grace_s, self._grace_ended)
                timer.daemon = True
                timer.start()

    def _grace_ended(self) -> None:
        if self.child.returncode is not None or self.closed:
            return
        log.error(
            "the script (pid %d) still runs %.0f s after the stop signal: killing its process group",
            self.child.pid,
            self.grace_s,
        )
        self.killed = True
        self.kill_group()

    def wait(self) -> int:
        """The script's exit status (negative: killed by that signal)."""
        return self.child.wait()

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signal.SIGKILL)

    def close(self) -> None:
        """The script has exited: what it left running goes (the reaper), its stderr is drained."""
        self.closed = True
        self.kill_group()
        with contextlib.suppress(OSError):
            self.reaper.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.reaper.wait(timeout=5)
        self.tee.join(timeout=5)
