"""tests/cputime.py: every session ends with its wall time, CPU-seconds and costliest phases, the CPU
of reaped child processes included, with and without pytest-xdist."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# A child that burns 1.5 CPU-s in a test's call; a module fixture's child (1 CPU-s) reaped in the
# teardown after the module's last test.
PROBE = """
import subprocess, sys
import pytest

BURN = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < {seconds}: pass"

@pytest.fixture(scope="module")
def server():
    process = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=1.0)])
    yield process
    process.wait()

def test_burn():
    subprocess.run([sys.executable, "-c", BURN.format(seconds=1.5)], check=True)

def test_uses_server(server):
    pass
"""


def run_probe(tmp_path: Path, *options: str) -> tuple[str, dict]:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_probe.py").write_text(PROBE)
    # the suite's own conftest registers the plugin; `tests` itself is imported from the checkout
    (tmp_path / "tests/conftest.py").write_text((REPO / "tests/conftest.py").read_text())
    report = tmp_path / "cpu.json"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options, "tests/test_probe.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "SCALESTUDY_CPU_REPORT": str(report)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, json.loads(report.read_text())


def phase_cpu(output: str, when: str, test: str) -> float:
    rows = [line.split() for line in output.splitlines() if line.strip().endswith(f"::{test}")]
    (row,) = [row for row in rows if len(row) == 4 and row[2] == when]
    return float(row[0])


@pytest.mark.parametrize("options", [(), ("-n", "2")], ids=["one process", "two xdist workers"])
def test_the_summary_charges_each_childs_cpu_to_the_phase_that_reaped_it(tmp_path, options):
    output, totals = run_probe(tmp_path, *options)
    assert "CPU time (tests/cputime.py)" in output and "costliest 20 phases" in output, output
    assert 1.4 <= phase_cpu(output, "call", "test_burn") < 3.0, output
    assert 0.9 <= phase_cpu(output, "teardown", "test_uses_server") < 2.5, output
    assert phase_cpu(output, "setup", "test_uses_server") < 0.5, output  # started there, reaped later
    assert totals["cpu_s"] >= 2.5 and totals["cpu_s"] == pytest.approx(totals["own_s"] + totals["children_s"])
    assert totals["workers"] == (2 if options else 0) and totals["wall_s"] > 0
    cpu, _, tests = totals["modules"]["tests/test_probe.py"]  # both tests' phases, children included
    assert tests == 2 and cpu >= 2.3, totals["modules"]
    assert "costliest 10 test modules" in output and output.count("tests/test_probe.py\n") >= 1, output


def test_the_sessions_add_up_and_a_missing_report_fails(tmp_path):
    reports = []
    for name, cpu, wall in (("a", 10.0, 100.0), ("b", 5.5, 120.0)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"cpu_s": cpu, "wall_s": wall}))
        reports.append(str(path))
    command = [sys.executable, "-m", "tests.cputime", "0", *reports]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "2 of 2 sessions" in run.stdout, run.stdout + run.stderr
    assert "120 s wall (the longest), 16 CPU-s" in run.stdout, run.stdout
    run = subprocess.run([*command, str(tmp_path / "missing.json")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 1 and "2 of 3 sessions" in run.stdout, run.stdout
