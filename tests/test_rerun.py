"""Partial re-runs keep their promise (issue 12): a changed config value re-runs exactly the points
that carry it, even with a checkpoint of the older run config in the way; a deleted summary.json
asked for again is measured anew, never restored from a checkpoint.

One demo run of two training points (a sensitivity point, which carries `sensitivity.epochs`, and a
scaling point, which does not) and the gates before them is shared by the module's tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy import atomic, provenance
from scalestudy.analysis import aggregate
from scalestudy.benchmark import dag
from scalestudy.plan import runconfig
from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint import single_file as checkpoint
from tests.conftest import REPO, copy_workflow, run_snakemake, write_config

pytestmark = pytest.mark.slow

SENSITIVITY = "results/runs/sensitivity/fp32/bs16_bucket1"
SCALING = "results/runs/scaling/strong/w1_r0"
TARGETS = [f"{SENSITIVITY}/summary.json", f"{SCALING}/summary.json"]


def _write_config(workdir: Path, name: str, sensitivity_epochs: int) -> str:
    """A --configfile copy of demo.yaml (it replaces the demo config rather than merging into it);
    it goes after the targets: --configfile takes every word that follows it."""

    def change(config: dict) -> None:
        config["sensitivity"]["epochs"] = sensitivity_epochs
        config["train"]["epochs"] = 1  # the scaling point: cheaper, and carries no sensitivity value
        # one rank everywhere: what is tested is which points re-run, and every check before them
        # (the site check, the smoke tests) then runs one process, not a launcher and two ranks
        config["scaling"]["world_sizes"] = [1]
        config["sensitivity"]["world_size"] = 1

    return write_config(workdir, name, change)


def _summary(workdir: Path, run_dir: str) -> dict:
    return json.loads((workdir / run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    workdir = copy_workflow(tmp_path_factory.mktemp("rerun") / "workflow")
    run_snakemake(workdir, *TARGETS, "--configfile", _write_config(workdir, "first.yaml", 1))
    return workdir


def test_a_changed_value_reruns_exactly_its_points_past_an_older_configs_checkpoint(demo):
    first = _summary(demo, SENSITIVITY)
    untouched = (demo / SCALING / "summary.json").read_bytes()
    assert first["results"]["epochs"] == 1
    assert_finished_runs_keep_only_their_last_checkpoint(demo)
    # An attempt of the older run config, interrupted mid-run, left its checkpoint behind.
    old_hash = provenance.config_hash({**runconfig.DEFAULTS, **first["run"]})
    position = {"epoch": 0, "step": 10, "global_step": 10}
    state = {"config_hash": old_hash, "run_config": first["run"], "position": position}
    stale = checkpoint.save(demo / first["run"]["checkpoint_dir"], state, 10)
    second_config = _write_config(demo, "second.yaml", 2)

    plan = run_snakemake(demo, "-n", *TARGETS, "--configfile", second_config)
    assert dag.job_counts(plan.stdout) == {"sensitivity_run": 1}, plan.stdout[-3000:]
    run_snakemake(demo, *TARGETS, "--configfile", second_config)

    second = _summary(demo, SENSITIVITY)
    assert second["results"]["epochs"] == 2 and second["run"]["epochs"] == 2
    assert second["results"]["resumed_from_step"] is None  # from scratch, not from the stale checkpoint
    assert second["provenance"]["timestamp"] != first["provenance"]["timestamp"]
    assert (demo / SCALING / "summary.json").read_bytes() == untouched
    log = (demo / "results/logs/sensitivity/fp32/bs16_bucket1.log").read_text()
    assert stale.name in log and old_hash in log, log[-3000:]
    assert not stale.exists()


def test_a_deleted_summary_asked_for_again_is_measured_anew(demo):
    config = _write_config(demo, "first.yaml", 1)
    old = _summary(demo, SCALING)
    (demo / SCALING / "summary.json").unlink()
    run_snakemake(demo, f"{SCALING}/summary.json", "--configfile", config)
    new = _summary(demo, SCALING)
    assert new["results"]["resumed_from_step"] is None and new["results"]["resumes"] == []
    assert new["provenance"]["timestamp"] != old["provenance"]["timestamp"]
    assert new["results"]["total_time_s"] != old["results"]["total_time_s"]
    assert_finished_runs_keep_only_their_last_checkpoint(demo)


def assert_finished_runs_keep_only_their_last_checkpoint(demo: Path) -> None:
    """A finished run keeps its newest checkpoint, marked finished, so that a retry of its job
    (outputs lost in a stop during the final writes) trains no step again; nothing older."""
    folders = {path.parent for path in (demo / "results/checkpoints").rglob("*.pt")}
    for folder in folders:
        if "superseded" in folder.parts:
            continue
        assert len(list(folder.glob("*.pt"))) == 1, sorted(folder.iterdir())
        assert (folder / policy.FINISHED).is_file(), sorted(folder.iterdir())


def test_re_measuring_the_contended_points_re_runs_exactly_them(demo, monkeypatch):
    """runs.csv marks the scaling point contended: the documented command's targets make Snakemake
    plan that point's training job again, and only it; with none contended, nothing."""
    trained = _summary(demo, SENSITIVITY)["run"]["epochs"]  # 2 after the changed-value test, else 1
    config = _write_config(demo, "current.yaml", trained)
    assert dag.job_counts(run_snakemake(demo, "-n", *TARGETS, "--configfile", config).stdout) == {}
    monkeypatch.chdir(demo)  # runs.csv's run_dir as the workflow writes it: relative to the workdir
    catalog = aggregate.build_catalog(TARGETS)
    catalog["contended"] = catalog["run_dir"] == SCALING
    atomic.write_csv(demo / "results/tables/runs.csv", catalog)
    printed = subprocess.run(
        [sys.executable, "-m", "scalestudy.analysis.contention", "targets"],
        cwd=demo,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert printed == [f"{SCALING}/summary.json"]
    plan = run_snakemake(demo, "-n", *TARGETS, "--configfile", config, "--forcerun", *printed)
    assert dag.job_counts(plan.stdout) == {"scaling_run": 1}, plan.stdout[-3000:]
    atomic.write_csv(demo / "results/tables/runs.csv", catalog.assign(contended=False))
    plan = run_snakemake(demo, "-n", *TARGETS, "--configfile", config, "--forcerun")  # $(...) empty
    assert dag.job_counts(plan.stdout) == {}, plan.stdout[-3000:]
