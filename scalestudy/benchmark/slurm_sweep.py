"""A sensitivity sweep of many points through Slurm job arrays: how many sbatch calls, how long.

    python -m scalestudy.benchmark.slurm_sweep --points 200 [--via "bash tests/slurm/cluster.sh exec"]

Run it in a scratch copy of the workflow (it writes config/slurm-sweep-<N>.yaml and results/ there).
It takes the demo's config (--base), makes a sweep of N points at world size 1 over one axis
(`seed`: N values; tiny steps: 1 epoch of 1 step, 1 evaluation batch), then, through the profile
(--profile, profiles/slurm-noapptainer), runs

1. what every training job waits for (data, smoke tests: the training gate), not counted;
2. the sweep's N summaries with `--slurm-array-jobs sensitivity_run`, timed.

It prints one JSON line: points, sbatch calls for the sweep (Snakemake's "Submitted array job" and
"has been submitted" lines of rule sensitivity_run: each is one sbatch), the arrays' sizes, the
summaries written and the wall time. `--via` puts a command before every Snakemake call (the test
cluster's client namespace). The profile's `jobs:` must be at least N: the plugin (2.8.0) drops
the jobs of an array rule that Snakemake hands over in a partial batch (docs/guide/cluster.md, "Job arrays").
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic, contract
from scalestudy.plan import grid, paths, runfiles

GATE = f"{paths.GATES_DIR}/training.ok"
PROFILE = "profiles/slurm-noapptainer"
ARRAY_SUBMITTED = re.compile(
    r"Submitted array job with Snakemake IDs \S+ and SLURM job ID (\d+)\. "
    r"The individual task IDs are (\d+)-(\d+)"
)
JOB_SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+) \(log: \S*rule_sensitivity_run/")

SWEEP_RUNTIME_MINUTES = 10
Runner = Callable[[list[str]], subprocess.CompletedProcess]


def sweep_config(base: dict, points: int) -> dict:
    """`base` with a sensitivity sweep of `points` one-rank points of one step each."""
    config = copy.deepcopy(base)
    config["sensitivity"].update(
        world_size=1, axes={"per_gpu_batch": [16], "seed": list(range(points))}, epochs=1
    )
    config["train"].update(max_steps_per_epoch=1, eval_max_batches=1)
    config["site_check"] = {"enabled": False}  # the sweep is measured, not the site
    # a point of one step needs seconds, but a loaded node may take a minute to start its Python:
    # a base with a short limit (the time-limit tests') would retry points and count those sbatch calls
    cluster = config.setdefault("cluster", {})
    cluster["runtime_minutes"] = max(SWEEP_RUNTIME_MINUTES, cluster.get("runtime_minutes") or 0)
    return config


def sweep_targets(config: dict) -> list[str]:
    return [
        f"{paths.RUNS_DIR}/sensitivity/{point.name}/{runfiles.SUMMARY}"
        for point in grid.sensitivity_points(config)
    ]


def sbatch_calls(output: str) -> tuple[int, list[int]]:
    """Sbatch calls of rule sensitivity_run in Snakemake's output, and the arrays' sizes."""
    arrays = [int(last) - int(first) + 1 for _, first, last in ARRAY_SUBMITTED.findall(output)]
    return len(arrays) + len(JOB_SUBMITTED.findall(output)), arrays


def controller_submissions(log: Path) -> int:
    """Batch jobs slurmctld accepted, by its log (SlurmctldDebug=info): one line per sbatch call."""
    return log.read_text(errors="replace").count("_slurm_rpc_submit_batch_job") if log.exists() else 0


def run(
    workdir: Path, points: int, runner: Runner, python: str = sys.executable, profile: str = PROFILE,
    base: str = "config/demo.yaml", extra: Sequence[str] = (), counter: Callable[[], int] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The benchmark in `workdir` (a workflow copy); `runner` runs a command there; `counter`, where
    given, counts the sbatch calls the cluster accepted so far (its controller's log)."""
    import yaml

    config = sweep_config(yaml.safe_load((workdir / base).read_text()), points)
    configfile = f"config/slurm-sweep-{points}.yaml"
    atomic.write_text(workdir / configfile, yaml.safe_dump(config, sort_keys=False))
    head = [python, "-m", "snakemake", "--profile", profile]
    result: dict[str, Any] = {"points": points, "configfile": configfile}
    gate = runner([*head, GATE, "--configfile", configfile])
    if gate.returncode != 0:
        return {**result, "returncode": gate.returncode, "stage": "gate", "output": gate.stdout + gate.stderr}
    targets = sweep_targets(config)
    before, started = counter() if counter else None, time.monotonic()
    options = ["--slurm-array-jobs", "sensitivity_run", *extra]
    sweep = runner([*head, *options, *targets, "--configfile", configfile])
    output = sweep.stdout + sweep.stderr
    calls, arrays = sbatch_calls(output)
    return {
        **result,
        "returncode": sweep.returncode,
        "stage": "sweep",
        "sweep_sbatch_calls": calls,
        "controller_sbatch_calls": counter() - before if counter else None,
        "array_sizes": arrays,
        "summaries": sum((workdir / target).is_file() for target in targets),
        "wall_s": round(time.monotonic() - started, 1),
        "output": output,
    }


def catalog(workdir: Path, summaries: Sequence[str], runner: Runner, python: str = sys.executable) -> None:
    """results/tables/runs.csv of these summaries, by the modules rule table_runs runs."""
    tables = workdir / paths.RESULTS_DIR / "tables"
    tables.mkdir(parents=True, exist_ok=True)
    accounting = str(tables / "sacct.json")
    for command in (
        [python, "-m", "scalestudy.analysis.accounting", "--summaries", *summaries, "--out", accounting],
        [python, "-m", "scalestudy.analysis.aggregate", "--summaries", *summaries, "--accounting", accounting,
         "--out", str(tables / "runs.csv")],
    ):  # fmt: skip
        done = runner(command)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(command[:4])} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.benchmark.slurm_sweep", description=__doc__)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="a scratch copy of the workflow")
    parser.add_argument("--profile", default=PROFILE)
    parser.add_argument("--base", default="config/demo.yaml", help="the config the sweep is made from")
    parser.add_argument("--via", default="", help="a command put before every Snakemake call")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per Snakemake call (then SIGINT)")
    parser.add_argument("--jobs", type=int, help="Snakemake's --jobs for the sweep (default: the profile's)")
    parser.add_argument(
        "--slurmctld-log", type=Path, help="count sbatch calls in it too (SlurmctldDebug=info)"
    )
    args = parser.parse_args(argv)
    if args.points < 2:
        print(f"--points must be >= 2 (an array of one is a job), got {args.points}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    if not (args.workdir / "Snakefile").is_file():
        print(f"--workdir {args.workdir}: no Snakefile (a copy of the workflow is needed)", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    prefix = shlex.split(args.via)

    def runner(command: list[str]) -> subprocess.CompletedProcess:
        timed = [*prefix, "timeout", "-s", "INT", "-k", "30", str(args.timeout), *command]
        return subprocess.run(timed, cwd=args.workdir, capture_output=True, text=True)

    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    counter = (lambda: controller_submissions(args.slurmctld_log)) if args.slurmctld_log else None
    result = run(
        args.workdir, args.points, runner, profile=args.profile, base=args.base, extra=extra, counter=counter
    )
    output = result.pop("output")
    if result["returncode"] != 0:
        print(output[-6000:], file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["returncode"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
