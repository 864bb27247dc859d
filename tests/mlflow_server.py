"""A real `mlflow server` and the MLflow UI in headless Chromium, for the tests that need them
(tests/test_tracking_server.py on this machine's 127.0.0.1, tests/test_slurm.py on the test
cluster's submit host). `via` runs the server, its health check and Chromium behind a command
prefix, e.g. `bash tests/slurm/cluster.sh exec` (the cluster's head network namespace, whose
127.0.0.1 is not this one's)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.chromium.devtools import HEADLESS

CHROMIUM_INSTALL = Path(__file__).resolve().parent / "chromium" / "install.sh"
CHROMIUM_FLAGS = [
    *HEADLESS,
    "--window-size=1600,1200",
    "--run-all-compositor-stages-before-draw",
    "--virtual-time-budget=60000",
]
HEALTH = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(folder: Path, port: int, via: Sequence[str] = ()) -> subprocess.Popen:
    """`mlflow server` on an SQLite backend in `folder` (mlflow.db, artifacts/); returns once its
    /health answers."""
    mlflow = Path(sys.executable).parent / "mlflow"
    command = [*via, str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder}/mlflow.db"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    log_path = folder / f"server-{port}.log"
    log = open(log_path, "a")  # noqa: SIM115 - closed with the process
    # as docs/guide/tracking.md starts it: without MLflow's GenAI job runner (8 processes fewer)
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env=env)
    health = [*via, sys.executable, "-c", HEALTH, f"http://127.0.0.1:{port}/health"]
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and server.poll() is None:
        if subprocess.run(health, capture_output=True, timeout=60).returncode == 0:
            return server
        time.sleep(0.5)
    stop_server(server)
    raise AssertionError(f"mlflow server did not start:\n{log_path.read_text()[-3000:]}")


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, as a crash would
    server.wait(timeout=30)


def chromium_binary() -> str:
    """Debian's chromium, installed here when missing (as root with apt-get), else a skip."""
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        done = subprocess.run(["sh", str(CHROMIUM_INSTALL)], capture_output=True, text=True, timeout=2400)
        found = shutil.which("chromium")
        assert found, f"{CHROMIUM_INSTALL} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    if found is None:
        pytest.skip("no chromium, and not root with apt-get to install Debian's")
    return found


def chromium_page(
    chromium: str, url: str, profile: Path, *args: str, via: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    command = [*via, chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def holds(dom: str, wanted: str) -> bool:
    """`wanted` is in the page's markup or in its text (`<strong>10</strong> matching runs` holds
    "10 matching runs")."""
    return wanted in dom or wanted in re.sub(r"<[^>]*>", "", dom)


def rendered(chromium: str, url: str, profile: Path, *wanted: str, via: Sequence[str] = ()) -> str:
    """The page's DOM once it holds every `wanted` string (a loaded machine renders late: 3 tries)."""
    for _ in range(3):
        page = chromium_page(chromium, url, profile, "--dump-dom", via=via)
        if all(holds(page.stdout, text) for text in wanted):
            break
    return page.stdout


def check_ui(
    chromium: str, port: int, experiment: str, study_run: str, runs: int, run_id: str, scratch: Path,
    via: Sequence[str] = (),
) -> Path:  # fmt: skip
    """The page the study links to (scalestudy.tracking.store.runs_page: the model-training view, not
    MLflow 3's GenAI overview) lists the study's run with its `runs` runs nested under it, and a
    point's metric chart renders; the runs page's screenshot (copied to
    $SCALESTUDY_SCREENSHOT_DIR/mlflow_ui.png when that is set)."""
    from scalestudy.tracking import store

    page = store.runs_page(f"http://127.0.0.1:{port}", experiment)
    base = f"http://127.0.0.1:{port}/#/experiments/{experiment}"
    listing = rendered(chromium, page, scratch / "profile", study_run, f"{runs} matching runs", via=via)
    assert holds(listing, study_run) and holds(listing, f"{runs} matching runs"), listing[-3000:]
    assert "Token Usage" not in listing  # not the GenAI overview (traces, tokens)
    # the charts come in the metrics' order, drawn as they scroll into view: the first are epoch_*
    metrics = f"{base}/runs/{run_id}/model-metrics"
    chart = rendered(chromium, metrics, scratch / "profile", "js-plotly-plot", "epoch_test_acc", via=via)
    assert "js-plotly-plot" in chart and "epoch_test_acc" in chart, chart[-3000:]
    shot = scratch / "mlflow_ui.png"
    chromium_page(chromium, page, scratch / "profile", f"--screenshot={shot}", via=via)
    assert shot.stat().st_size > 20_000
    if os.environ.get("SCALESTUDY_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["SCALESTUDY_SCREENSHOT_DIR"]) / "mlflow_ui.png")
    return shot
