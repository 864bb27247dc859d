"""What scripts/demo.sh prints (scalestudy.console): Snakemake's console condensed as it streams, the
closing summary read from results/, and each job's log opening with its command. The demo's whole
console: tests/test_workflow.py."""

from __future__ import annotations

import json
import logging
import os
import sys

import pandas as pd

from scalestudy import progress
from scalestudy.console import condense, summary

SNAKEMAKE = """Using profile profiles/local for setting default command line arguments.
paper: latexmk not found, so results/paper/paper.pdf is skipped (paper.tex is still written).
Assuming unrestricted shared filesystem usage.

SNAKEMAKE
=========
  Date: 2026-11-29 02:05:44
  Host: vm

Building DAG of jobs...
Using shell: /usr/bin/bash
Provided cores: 2
Rules claiming more threads will be scaled down.
Job stats:
job         count
--------  -------
fetch           1
scaling_run     2
all             1
total           4

Select jobs to execute...
Execute 1 jobs...

[Sun Nov 29 02:05:44 2026]
localrule fetch:
    output: results/data/cifar-10-python.tar.gz
    log: results/logs/fetch.log
    jobid: 5
    reason: Missing output files: results/data/cifar-10-python.tar.gz
    resources: tmpdir=/tmp, cpus_per_task=1, runtime=10, mem_mb=1000, mem=1 GB, mem_mib=954
2026/11/29 02:05:57 INFO mlflow.store.db.utils: Creating initial MLflow database tables...
[Sun Nov 29 02:05:46 2026]
Finished jobid: 5 (Rule: fetch)
1 of 4 steps (25%) done
Select jobs to execute...
WARNING: a point's window is short
[Sun Nov 29 02:06:46 2026]
Error in rule scaling_run:
    message: None
    jobid: 7
    log: results/logs/scaling/w2.log (check log file(s) for error details)
Shutting down, this might take some time.
Adding smoke.csv (575 bytes).
Adding throughput.png (57.15 KB).
Report created.
"""


def test_a_finished_job_is_one_line_and_errors_and_warnings_pass_whole():
    shown = list(condense.condense(SNAKEMAKE.splitlines(keepends=True)))
    assert shown == [
        "paper: latexmk not found, so results/paper/paper.pdf is skipped (paper.tex is still written).",
        "Job stats: 4 jobs of 3 rules (the table: Snakemake's log)",
        "[02:05:46] 1 of 4 steps (25%) done: fetch",
        "WARNING: a point's window is short",
        "[02:06:46]",
        "Error in rule scaling_run:",
        "    message: None",
        "    jobid: 7",
        "    log: results/logs/scaling/w2.log (check log file(s) for error details)",
        "Shutting down, this might take some time.",
        "Report created.",
    ]


def test_the_summary_says_where_everything_is_the_headline_numbers_and_how_to_open_mlflow(tmp_path):
    tables = tmp_path / "results/tables"
    tables.mkdir(parents=True)
    rows = [("strong", 1, 454.1, 1.0, 1.0), ("strong", 2, 715.7, 1.576, 0.788), ("weak", 1, 295.4, 1.0, 1.0)]
    scaling = pd.DataFrame(
        rows, columns=["mode", "world_size", "images_per_s_mean", "speedup_mean", "efficiency_mean"]
    )
    scaling.assign(parallelism="ddp", sample_unit="images").to_csv(tables / "scaling.csv", index=False)
    pd.DataFrame({"status": ["pass", "fail", "not measured (largest N=2)", "not measured"]}).to_csv(
        tables / "acceptance.csv", index=False
    )
    pd.DataFrame({"run_dir": ["a", "b", "c"]}).to_csv(tables / "runs.csv", index=False)
    (tmp_path / "results/report.html").write_text("<html></html>")
    (tmp_path / "results/paper").mkdir()
    (tmp_path / "results/paper/paper.tex").write_text("\\documentclass{article}")
    (tmp_path / "results/crate").mkdir()
    graph = [{"@id": "a.csv", "@type": "File"}, {"@id": "b", "@type": ["File", "HowTo"]}, {"@id": "./"}]
    (tmp_path / "results/crate/ro-crate-metadata.json").write_text(json.dumps({"@graph": graph}))
    (tmp_path / "results/crate.zip").write_bytes(b"x" * 2_000_000)
    sync = tmp_path / summary.SYNC_RECORD
    sync.parent.mkdir(parents=True)
    sync.write_text(
        json.dumps({"ui": "http://127.0.0.1:5000/#/experiments/1/runs", "ui_command": "mlflow ui X"})
    )
    lines = summary.summary(tmp_path, "demo", 445.2)
    assert lines[0] == f"demo: done in 7 min 25 s. The study, under {tmp_path.resolve()}/results:"
    assert lines[1:5] == [
        "  report: results/report.html",
        "  paper:  results/paper/paper.tex (no PDF: no LaTeX here)",
        "  crate:  results/crate.zip (2 files, 2.0 MB; check it: "
        "python -m scalestudy.crate validate results/crate.zip)",
        "  tables: results/tables/ (3 CSV files; runs.csv: 3 runs)",
    ]
    assert "  strong scaling (ddp): 454 images/s at N=1, 716 at N=2: speedup 1.58, efficiency 78.8 %" in lines
    assert "  weak scaling (ddp): 295 images/s at N=1" in lines
    assert "  acceptance criteria: 2 not measured, 1 pass, 1 fail (results/tables/acceptance.csv)" in lines
    assert lines[-2:] == ["MLflow: mlflow ui X", "  then open http://127.0.0.1:5000/#/experiments/1/runs"]
    sync.unlink()
    assert summary.summary(tmp_path)[-1].startswith("MLflow: no record of the tracking job")


def test_a_jobs_log_opens_with_its_command_once_never_on_a_terminal_or_pipe(tmp_path, monkeypatch, caplog):
    from scalestudy import commandline

    monkeypatch.setattr(commandline, "program", lambda spec=None: "python -m scalestudy.fake")
    monkeypatch.setattr(sys, "argv", ["fake", "--out", "a b.csv"])
    monkeypatch.setattr(progress, "_COMMAND_LOGGED", [])
    with open(tmp_path / "job.log", "w") as log_file, caplog.at_level(logging.INFO, "scalestudy"):
        monkeypatch.setattr(sys, "stderr", log_file)
        progress._log_command()
        progress._log_command()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("command:")]
    assert said == ["command: python -m scalestudy.fake --out 'a b.csv'"]
    caplog.clear()
    monkeypatch.setattr(progress, "_COMMAND_LOGGED", [])
    read, write = os.pipe()
    with open(write, "w") as pipe, open(read):
        monkeypatch.setattr(sys, "stderr", pipe)
        progress._log_command()
    assert not [r for r in caplog.records if r.getMessage().startswith("command:")]
