"""A real `mlflow server` on 127.0.0.1: a training job whose server is killed in the middle (while
the study's follower sends its journal) still finishes with a complete run folder, and the
follower and rule track's sync fill MLflow afterwards with nothing lost and nothing twice. (The
demo against a server, and its runs in the MLflow UI in headless Chromium: tests/test_slurm.py.)"""

# ruff: noqa: F811 - the fixtures imported from tests/tracking_runs.py are the tests' parameters

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy import tracking
from tests.mlflow_server import free_port, start_server, stop_server
from tests.processes import global_step
from tests.tracking_runs import clean_environ, data_dir, make_run  # noqa: F401 - fixture

pytest.importorskip("mlflow")

from scalestudy.tracking import store, sync  # noqa: E402
from scalestudy.train.journal import JOURNAL  # noqa: E402
from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tmp_path_factory, data_dir):
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
    """Holds the trainer (SIGSTOP) once it has logged a few steps, waits until the point's run holds
    a step metric (the follower sends steps every few seconds: a short run could end first), kills
    the server, lets the trainer go on (SIGCONT); True if the trainer was still training then."""
    for line in iter(trainer.stderr.readline, ""):
        if (global_step(line) or 0) >= 3:
            trainer.send_signal(signal.SIGSTOP)
            break
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
    trainer.send_signal(signal.SIGCONT)
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
        journal = [json.loads(line) for line in (folder / JOURNAL).read_text().splitlines()]
        wanted = sorted(item["at"][0] for item in journal if item["kind"] == "step")
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "samples_per_s"))
        assert steps == wanted and len(set(steps)) == len(steps), point  # every step, once
        summary = json.loads((folder / "summary.json").read_text())["results"]
        assert run.data.metrics["summary_final_test_acc"] == pytest.approx(summary["final_test_acc"])
    again = sync.sync(settings, root / "results/runs", [], root)
    assert sum(r["metrics"] + r["artifacts"] for r in again["runs"]) == 0


# the runs table's name cells: a row's expander (a run with nested runs) and its name
EXPANDERS = "[...document.querySelectorAll('button[data-component-id*=runnamecellrenderer]')]"
CLOSE_ASSISTANT = "document.querySelector('button[data-component-id=\"mlflow.assistant.chat_panel.close\"]')"


def test_the_runs_page_lists_the_stages_under_the_study_and_the_points_under_them(study, tmp_path):
    """The page the sync prints, in headless Chromium: MLflow 3's model-training runs table (not the
    GenAI overview), the study's run with one run per stage nested under it, each point under its
    stage (opened as a user opens them, with a click on each expander); its screenshot kept in
    $SCALESTUDY_SCREENSHOT_DIR/mlflow_ui.png when that is set."""
    from tests.chromium.devtools import Page
    from tests.mlflow_server import chromium_binary

    _, settings, _, record, port = study
    client = store.client(settings)
    page_url = store.runs_page(f"http://127.0.0.1:{port}", store.experiment_id(client, settings))
    assert page_url == record["ui"]  # the address the sync printed
    stages, points = ["scaling", "sensitivity"], ["scaling/strong-w1_r0", "sensitivity/bs32"]
    with Page(chromium_binary(), tmp_path / "profile") as page:
        text = page.open(page_url, "study served", "5 matching runs")  # the study, 2 stages, 2 points
        assert "5 matching runs" in text and "Model training" in text, text[-2000:]
        assert "Token Usage" not in text and "Detect Issues" not in text  # not the GenAI overview
        rows = text.splitlines()
        assert not set(stages + points) & set(rows), "nested: only the study's run shows at first"
        page.evaluate(f"{EXPANDERS}[0].click()")
        rows = page.wait_for(*stages, timeout_s=60).splitlines()
        assert set(stages) <= set(rows) and not set(points) & set(rows), rows
        assert page.evaluate(f"{EXPANDERS}.length") == 3  # the study's and each stage's
        page.evaluate(f"{EXPANDERS}.slice(1).forEach(button => button.click())")
        rows = page.wait_for(*points, timeout_s=60).splitlines()
        assert set(points) <= set(rows), rows
        page.evaluate(f"{CLOSE_ASSISTANT}?.click()")
        time.sleep(1)
        shot = page.screenshot(tmp_path / "mlflow_ui.png")
    assert shot.stat().st_size > 20_000
    if os.environ.get("SCALESTUDY_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["SCALESTUDY_SCREENSHOT_DIR"]) / "mlflow_ui.png")
