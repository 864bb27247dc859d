"""A real `mlflow server` on 127.0.0.1: a training job whose server is killed in the middle (while
the study's follower sends its journal) still finishes with a complete run folder, and the
follower and rule track's sync fill MLflow afterwards with nothing lost and nothing twice; then
the MLflow UI, in headless Chromium (Debian's chromium, installed here as root when missing), lists
every point on the experiment page and renders a run's metric chart. With
SCALESTUDY_SCREENSHOT_DIR set, the experiment page's screenshot is saved there
(docs/figures/mlflow_ui.png)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from scalestudy import tracking
from tests.test_tracking import clean_environ, data_dir, make_run  # noqa: F401 - fixture

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--window-size=1600,1200",
    "--run-all-compositor-stages-before-draw",
    "--virtual-time-budget=60000",
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(folder: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on an SQLite backend in `folder`; returns once /health answers."""
    mlflow = Path(sys.executable).parent / "mlflow"
    command = [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{folder}/mlflow.db"]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    log = open(folder / f"server-{port}.log", "a")  # noqa: SIM115 - closed with the process
    server = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
        if server.poll() is not None:
            break
    stop_server(server)
    raise AssertionError(
        f"mlflow server did not start:\n{(folder / f'server-{port}.log').read_text()[-3000:]}"
    )


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGKILL)  # the server and its workers, as a crash would
    server.wait(timeout=30)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "install", "-y", "chromium"], capture_output=True, timeout=900)
        found = shutil.which("chromium")
    if found is None:
        pytest.skip("no chromium, and not root with apt-get to install Debian's")
    return found


@pytest.fixture(scope="module")
def study(tmp_path_factory, data_dir):  # noqa: F811
    """Two points trained against a server that is killed while the first one trains; then the
    server restarted on the same store and the sync run. (root, settings, run folders, port)."""
    root = tmp_path_factory.mktemp("served")
    port = free_port()
    settings = {**tracking.settings({"study": {"name": "served"}}, root), "uri": f"http://127.0.0.1:{port}"}
    settings["artifact_root"] = None
    server = start_server(root, port)
    logs = root / "results/logs/tracking"
    tracking.start_follower(settings, logs, [root / "results/runs"])  # the study's, as onstart starts it
    env = {**clean_environ(), "OMP_NUM_THREADS": "1", **tracking.to_environ(settings)}
    folders, killed_while_training = [], None
    points = [("scaling/strong-w1_r0", {"epochs": 8, "per_gpu_batch": 8, "global_batch": 8})]
    points += [("sensitivity/bs32", {"per_gpu_batch": 32, "global_batch": 32})]
    client = store.client(settings)
    for point, changes in points:
        out, config = make_run(root, data_dir, point, max_steps_per_epoch=20, **changes)
        command = [sys.executable, "-m", "scalestudy.train", "--run-config-json", json.dumps(config)]
        trainer = subprocess.Popen(
            [*command, "--out-dir", str(out)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True
        )
        if killed_while_training is None:  # kill the server once the run has streamed some steps
            killed_while_training = kill_once_streaming(client, settings, point, server, trainer)
        _, errors = trainer.communicate(timeout=600)
        assert trainer.returncode == 0, errors[-4000:]
        assert (out / "summary.json").is_file()
        folders.append(out)
    assert killed_while_training, "the trainer finished before the server was killed"
    server = start_server(root, port)
    assert tracking.stop_follower(logs / tracking.FOLLOWER_PID)  # as rule track stops it, then its sync
    record = sync.sync(settings, root / "results/runs", [], root)
    yield root, settings, folders, record, port
    stop_server(server)


def kill_once_streaming(client, settings, point, server, trainer) -> bool:
    """Waits until the point's run holds a step metric, kills the server; True if the trainer was
    still training then."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and trainer.poll() is None:
        try:
            runs = store.find_runs(client, store.experiment_id(client, settings), point)
            if runs and store.logged_steps(client, runs[0].info.run_id, "samples_per_s"):
                break
        except Exception:  # noqa: BLE001 - the experiment is not there yet
            pass
        time.sleep(0.2)
    training = trainer.poll() is None
    stop_server(server)
    return training


def test_the_server_killed_mid_run_loses_nothing_and_doubles_nothing(study):
    root, settings, folders, record, _ = study
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    assert [r["point"] for r in record["runs"]] == ["scaling/strong-w1_r0", "sensitivity/bs32"]
    for folder in folders:
        point = tracking.point_of(folder)
        (run,) = store.find_runs(client, experiment, point)
        assert run.info.status == "FINISHED", point
        journal = [json.loads(line) for line in (folder / tracking.JOURNAL).read_text().splitlines()]
        wanted = sorted(item["at"][0] for item in journal if item["kind"] == "step")
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s"))
        assert steps == wanted and len(set(steps)) == len(steps), point  # every step, once
        summary = json.loads((folder / "summary.json").read_text())["results"]
        assert run.data.metrics["summary_final_test_acc"] == pytest.approx(summary["final_test_acc"])
    again = sync.sync(settings, root / "results/runs", [], root)
    assert sum(r["metrics"] + r["artifacts"] for r in again["runs"]) == 0


def chromium_page(chromium: str, url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=180)


def rendered(chromium: str, url: str, profile: Path, *wanted: str) -> str:
    """The page's DOM once it holds every `wanted` string (a loaded machine renders late: 3 tries)."""
    for _ in range(3):
        page = chromium_page(chromium, url, profile, "--dump-dom")
        if all(text in page.stdout for text in wanted):
            break
    return page.stdout


def test_the_ui_lists_every_point_and_draws_a_metric_chart(study, chromium, tmp_path):
    root, settings, folders, _, port = study
    client = store.client(settings)
    experiment = store.experiment_id(client, settings)
    page = f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs"
    points = [tracking.point_of(folder) for folder in folders]
    listing = rendered(chromium, page, tmp_path / "profile", *points)
    assert all(point in listing for point in points), listing[-3000:]
    (run,) = store.find_runs(client, experiment, "scaling/strong-w1_r0")
    metrics = f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs/{run.info.run_id}/model-metrics"
    # the charts come in the metrics' order, drawn as they scroll into view: the first are epoch_*
    chart = rendered(chromium, metrics, tmp_path / "profile", "js-plotly-plot", "epoch_test_acc")
    assert "js-plotly-plot" in chart and "epoch_test_acc" in chart, chart[-3000:]
    shot = tmp_path / "mlflow_ui.png"
    chromium_page(chromium, page, tmp_path / "profile", f"--screenshot={shot}")
    assert shot.stat().st_size > 20_000
    if os.environ.get("SCALESTUDY_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["SCALESTUDY_SCREENSHOT_DIR"]) / "mlflow_ui.png")
