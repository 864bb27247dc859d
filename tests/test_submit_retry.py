"""scalestudy.launch.submit_retry: the `sbatch` wrapper that waits out a site's submit limit.

A real subprocess stands in for sbatch (tests/test_slurm_queue.py runs it against the real Slurm
cluster): it is refused N times with Slurm 22.05's message, then accepts; every try's stdin is kept.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy.launch import submit_retry
from tests.conftest import copy_workflow, snakemake_env

# What sbatch 22.05 prints when the user's association is at its MaxSubmitJobs (run on the test cluster).
REFUSED = (
    "sbatch: error: AssocMaxSubmitJobLimit\n"
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
    "user's size and/or time limits)\n"
)
TOO_LONG = (
    "sbatch: error: QOSMaxWallDurationPerJobLimit\n"
    "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, "
    "user's size and/or time limits)\n"
)
BAD_PARTITION = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"

# The stand-in: refused while the count file says so, then prints a job id; every try's stdin and
# arguments are kept in tries/<n>.
FAKE = """#!{python}
import os, sys
from pathlib import Path
here = Path({here!r})
tries = here / "tries"
tries.mkdir(exist_ok=True)
n = len(list(tries.iterdir())) + 1
data = b"" if "--wrap" in " ".join(sys.argv) else sys.stdin.buffer.read()
(tries / str(n)).write_bytes(repr(sys.argv[1:]).encode() + b"\\n" + data)
if n <= int((here / "refusals").read_text()):
    sys.stderr.write((here / "message").read_text())
    sys.exit(1)
print("4242")
"""


@pytest.fixture
def sbatch(tmp_path):
    """(run, fake folder): run(args, stdin, refusals, message, **install) calls `sbatch` through a shell,
    as the Slurm plugin does, with the wrapper first on PATH and the stand-in after it."""
    real = tmp_path / "real"
    real.mkdir()
    fake = real / "sbatch"
    fake.write_text(FAKE.format(python=sys.executable, here=str(real)))
    fake.chmod(0o755)

    def run(args, stdin=b"", refusals=0, message=REFUSED, timeout=60, **install):
        (real / "refusals").write_text(str(refusals))
        (real / "message").write_text(message)
        install = {
            "first_wait_s": 0.05,
            "max_wait_s": 0.2,
            "log_path": str(tmp_path / "retries.log"),
        } | install
        folder = submit_retry.install(str(tmp_path / "wrapper"), **install)
        env = dict(os.environ)
        submit_retry.put_first(env, str(real))
        submit_retry.put_first(env, folder)
        return subprocess.run(
            f"sbatch {args}", shell=True, input=stdin, capture_output=True, env=env, timeout=timeout
        )

    return run, real


def tries(real: Path) -> list[bytes]:
    folder = real / "tries"
    return [(folder / str(n)).read_bytes() for n in range(1, len(list(folder.iterdir())) + 1)]


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (REFUSED, "AssocMaxSubmitJobLimit"),
        (
            REFUSED.replace("AssocMaxSubmitJobLimit", "QOSMaxSubmitJobPerUserLimit"),
            "QOSMaxSubmitJobPerUserLimit",
        ),
        ("sbatch: error: QOSGrpSubmitJobsLimit\n", "QOSGrpSubmitJobsLimit"),
        (REFUSED.splitlines(keepends=True)[1], "job submit limit (accounting/QOS policy)"),  # no reason line
        (TOO_LONG, None),  # too long for the QOS: waiting does not help
        (BAD_PARTITION, None),
        ("", None),
    ],
)
def test_only_a_submit_limit_is_a_refusal_worth_waiting_for(stderr, reason):
    assert submit_retry.refusal_reason(stderr) == reason


def test_the_waits_start_at_30_s_and_double_up_to_5_min():
    waits = submit_retry.waits(submit_retry.FIRST_WAIT_S, submit_retry.MAX_WAIT_S)
    assert [next(waits) for _ in range(7)] == [30, 60, 120, 240, 300, 300, 300]


def test_a_refused_submission_is_tried_again_with_the_same_stdin_until_accepted(sbatch, tmp_path):
    run, real = sbatch
    script = b"#!/bin/sh\npython -m snakemake --jobs 1 'a b'\n"
    result = run(
        "--parsable --job-name x --comment 'rule_a_wildcards_i=2' /dev/stdin", stdin=script, refusals=3
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"4242\n"
    got = tries(real)
    assert len(got) == 4
    args = ["--parsable", "--job-name", "x", "--comment", "rule_a_wildcards_i=2", "/dev/stdin"]
    assert set(got) == {repr(args).encode() + b"\n" + script}
    # The plugin raises on "submission failed" in an accepted sbatch's stderr: the refusals are not in it.
    assert b"submission failed" not in result.stderr
    log = (tmp_path / "retries.log").read_text().splitlines()
    assert len(log) == 4, log
    assert all(
        "(scalestudy) rule_a_wildcards_i=2: refused by the submit limit AssocMaxSubmitJobLimit" in line
        for line in log[:3]
    )
    assert "accepted after 3 refusal(s)" in log[3] and log[3].endswith("4242")
    assert log == [line.decode() for line in result.stderr.splitlines()]


def test_any_other_failure_passes_through_at_once_unchanged(sbatch):
    run, real = sbatch
    result = run("--parsable -p nosuch --wrap 'sleep 1'", refusals=5, message=BAD_PARTITION)
    assert (result.returncode, result.stdout, result.stderr) == (1, b"", BAD_PARTITION.encode())
    assert len(tries(real)) == 1


def test_a_job_too_big_for_the_qos_is_not_waited_for(sbatch):
    run, real = sbatch
    result = run("--parsable -t 9999 --wrap 'sleep 1'", refusals=5, message=TOO_LONG)
    assert (result.returncode, result.stderr) == (1, TOO_LONG.encode())
    assert len(tries(real)) == 1


def test_after_its_patience_the_refusal_fails_naming_the_limit_and_the_setting(sbatch, tmp_path):
    run, real = sbatch
    result = run("--parsable --wrap 'sleep 1'", refusals=1000, patience_minutes=0.01)  # 0.6 s
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert REFUSED in stderr  # Slurm's own words stay in what the plugin reports
    assert "still refused by the submit limit AssocMaxSubmitJobLimit" in stderr
    assert "cluster.submit_retry_minutes = 0.01" in stderr and "MaxSubmitJobs" in stderr
    assert 3 <= len(tries(real)) <= 8  # 0.05 + 0.1 + 0.2 + 0.2 ... within 0.6 s


def test_patience_0_fails_at_the_first_refusal(sbatch):
    run, real = sbatch
    result = run("--parsable --wrap 'sleep 1'", refusals=1, patience_minutes=0)
    assert result.returncode == 1 and b"still refused" in result.stderr
    assert len(tries(real)) == 1


def test_a_wrap_job_does_not_wait_for_a_stdin_that_is_never_closed(sbatch, tmp_path):
    run, real = sbatch
    folder = submit_retry.install(str(tmp_path / "wrapper"), first_wait_s=0.05, max_wait_s=0.1)
    env = dict(os.environ)
    submit_retry.put_first(env, str(real))
    submit_retry.put_first(env, folder)
    (real / "refusals").write_text("1")
    (real / "message").write_text(REFUSED)
    with subprocess.Popen(
        "sbatch --wrap 'sleep 1'", shell=True, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as process:  # stdin stays open, as a caller that never closes it
        assert process.wait(timeout=30) == 0
        assert process.stdout.read() == b"4242\n"
        process.stdin.close()
    assert len(tries(real)) == 2


def test_the_real_sbatch_is_the_next_on_path_never_a_wrapper(tmp_path):
    first = submit_retry.install(str(tmp_path / "one"))
    second = submit_retry.install(str(tmp_path / "two"))  # e.g. another workflow's, inherited
    real = tmp_path / "bin"
    real.mkdir()
    (real / "sbatch").write_text("#!/bin/sh\n")
    (real / "sbatch").chmod(0o755)
    path = os.pathsep.join([first, second, str(tmp_path / "missing"), str(real)])
    assert submit_retry.real_sbatch(path, first) == str(real / "sbatch")
    assert submit_retry.real_sbatch(os.pathsep.join([first, second]), first) is None


def test_without_a_real_sbatch_it_says_so_and_exits_127(tmp_path):
    folder = submit_retry.install(str(tmp_path / "wrapper"))
    env = {"PATH": folder}
    result = subprocess.run([f"{folder}/sbatch", "--wrap", "true"], env=env, capture_output=True, text=True)
    assert result.returncode == 127
    assert "no sbatch on PATH after" in result.stderr


def test_put_first_puts_the_folder_first_once():
    env = {"PATH": "/usr/bin:/bin"}
    submit_retry.put_first(env, "/w")
    submit_retry.put_first(env, "/w")
    assert env["PATH"] == "/w:/usr/bin:/bin"


def test_the_wrapper_runs_the_standard_library_only(tmp_path):
    """The wrapper runs this file with -I -S (no site-packages): importing it must need nothing else."""
    folder = submit_retry.install(str(tmp_path / "wrapper"))
    text = Path(folder, "sbatch").read_text()
    assert " -I -S " in text and submit_retry.MARKER in text
    check = subprocess.run(
        [sys.executable, "-I", "-S", submit_retry.__file__, "--help"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stderr


def test_the_study_installs_the_wrapper_with_the_configs_patience(tmp_path):
    """rules/common/hooks.smk: where sbatch is on PATH, parsing the workflow writes the wrapper, with
    cluster.submit_retry_minutes and the log under results/logs/slurm/."""
    workdir = copy_workflow(tmp_path / "scalestudy")
    fake = tmp_path / "slurm-bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    (workdir / "extra.yaml").write_text("cluster:\n  submit_retry_minutes: 7\n")
    env = snakemake_env()
    env["PATH"] = f"{env['PATH']}{os.pathsep}{fake}"
    command = [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/local"]
    command += ["--configfile", "config/demo.yaml", "extra.yaml"]
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    wrapper = (workdir / ".snakemake/scalestudy-sbatch/sbatch").read_text()
    assert "--patience-minutes 7 " in wrapper
    assert f"--log {workdir}/results/logs/slurm/sbatch-retries.log" in wrapper
