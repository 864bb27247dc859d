"""The profiled training run of one world size (stdlib only: it runs where the launcher runs).

    python -m scalestudy.profiling.run --launch-json J --run-config-json R --out-dir D \
        --record D/profile_tool.json

1. resolves the run's `profile.tool` (auto -> nsys or torch, see `scalestudy.profiling.tool`) and
   puts the resolved tool into the run config the trainer gets;
2. clears the run's previous profiling output and its checkpoints: a run resumed past the
   profiling window would never open it;
3. starts the ranks with `python -m scalestudy.launch --rank-prefix-json` (launch.build_command's
   rank_prefix): the `nsys profile` prefix goes per rank, inside srun and the container;
4. checks the tool's output is there (torch: profile_ops.csv + profile_window.json; nsys: one
   report per rank) and only then writes the record, so no tool is ever claimed that did not run.

The trainer's exit code is passed on (75 = checkpointed, retry and resume).
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from scalestudy import contract
from scalestudy.atomic import write_json
from scalestudy.plan import grid, runfiles
from scalestudy.profiling import nsys
from scalestudy.profiling.tool import Resolution, find_binary, find_gpu, resolve
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.profiling.run")

NSYS_DIR = "nsys"
TORCH_FILES = (runfiles.PROFILE_OPS, runfiles.PROFILE_WINDOW)
RECORD_FILE = "profile_tool.json"


def with_profile_tool(run: dict, tool: str) -> dict:
    """A copy of the run config whose profiling window uses `tool` (torch, nsys or none)."""
    profile = run.get("profile")
    if not profile:
        raise ValueError("the run config has no profile section: not a profile run")
    return {**run, "profile": {**profile, "tool": tool}}


def train_args(run: dict, out_dir: str | Path) -> list[str]:
    return ["--run-config-json", json.dumps(run, sort_keys=True), "--out-dir", str(out_dir)]


def launcher_kind(spec: dict) -> str:
    """srun or local: what the launcher will use here (`auto` is srun in a Slurm batch step)."""
    from scalestudy.launch import launcher as launch

    return launch.resolve_launcher(launch.check_spec(spec), os.environ)


def launch_argv(
    spec: dict,
    run: dict,
    out_dir: str | Path,
    rank_prefix: list[str] | tuple = (),
    launch_options: list[str] | tuple = (),
) -> list[str]:
    """`python -m scalestudy.launch` with the per-rank prefix (launch.build_command's rank_prefix)
    and the launcher's own options (`--log L --attempt N`: every attempt's log is kept)."""
    return [
        sys.executable,
        "-m",
        "scalestudy.launch",
        "--launch-json",
        json.dumps(spec, sort_keys=True),
        "--rank-prefix-json",
        json.dumps(list(rank_prefix)),
        *launch_options,
        "--",
        *train_args(run, out_dir),
    ]


JOB_TMPDIR = "tmp"


def with_job_tmpdir(spec: dict, folder: str | Path) -> dict:
    """The launch spec with TMPDIR set to `folder` (created; absolute, so every node and the image see
    it): nsys and ncu keep their session files under $TMPDIR/nvidia, and a /tmp/nvidia left by another
    user's job on the same node makes them fail with "permission denied"."""
    folder = Path(folder).absolute()
    folder.mkdir(parents=True, exist_ok=True)
    return {**spec, "env": {**spec.get("env", {}), "TMPDIR": str(folder)}}


FORWARDED_SIGNALS = (*contract.STOP_SIGNALS, signal.SIGINT)  # the stop signals, and Ctrl-C


def run_streaming(argv: list[str], keep_lines: int = 200) -> tuple[int, list[str]]:
    """Run `argv`, copying its output to stderr (the rule's log); return exit code and last lines.

    SIGTERM/SIGINT/SIGUSR1 are passed on to the child (the launcher, hence srun and the ranks), as
    if the launcher had been exec'd: a checkpoint-and-exit-75 request reaches the trainer.
    """
    log.info("running: %s", " ".join(argv))
    tail: collections.deque[str] = collections.deque(maxlen=keep_lines)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        previous = {
            sig: signal.signal(sig, lambda sig, _frame: proc.send_signal(sig)) for sig in FORWARDED_SIGNALS
        }
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                tail.append(line.rstrip("\n"))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return proc.returncode, list(tail)


def clear_checkpoints(run: dict) -> None:
    """Remove the profile run's checkpoints (only ever under results/checkpoints/profile/)."""
    folder = Path(run["checkpoint_dir"])
    allowed = Path(grid.CHECKPOINTS_DIR) / "profile"
    if allowed not in folder.parents:
        raise ValueError(f"refusing to clear {folder}: not under {allowed}/")
    if folder.exists():
        log.info("clearing %s: the profiling window needs a run from step 0", folder)
        shutil.rmtree(folder)


def clear_previous_output(out_dir: Path) -> None:
    shutil.rmtree(out_dir / NSYS_DIR, ignore_errors=True)
    for name in (*TORCH_FILES, RECORD_FILE):
        (out_dir / name).unlink(missing_ok=True)


def evidence(tool: str, out_dir: Path, world_size: int) -> dict:
    """The files that prove the tool ran; raises if they are missing."""
    if tool == "torch":
        missing = [name for name in TORCH_FILES if not (out_dir / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{out_dir}: the trainer ran with profile tool torch but wrote no {missing} "
                "(did the run reach the profiling window?)"
            )
        return {name.split(".")[0]: str(out_dir / name) for name in TORCH_FILES}
    reports = nsys.rank_reports(out_dir / NSYS_DIR, world_size)
    return {"nsys_reports": {str(rank): str(path) for rank, path in reports.items()}}


def resolve_for(run: dict, spec: dict, nsys_binary: str) -> Resolution:
    return resolve(
        run["profile"]["tool"],
        run["device"],
        nsys_probe=lambda: find_binary(nsys_binary, spec.get("image")),
        gpu_probe=find_gpu,
    )


def profile_run(
    spec: dict, run: dict, out_dir: Path, nsys_binary: str = "nsys", launch_options: list[str] | tuple = ()
) -> tuple[int, dict | None]:
    """Resolve the tool, train, check the evidence; (exit code, record or None on failure)."""
    resolution = resolve_for(run, spec, nsys_binary)
    log.info(
        "profiling tool: %s (requested %s): %s", resolution.tool, resolution.requested, resolution.reason
    )
    run = with_profile_tool(run, resolution.tool)
    clear_checkpoints(run)
    clear_previous_output(out_dir)
    prefix: list[str] = []
    if resolution.tool == "nsys":
        (out_dir / NSYS_DIR).mkdir(parents=True, exist_ok=True)
        prefix = nsys.profile_prefix(
            out_dir / NSYS_DIR, nsys.rank_variable(launcher_kind(spec)), nsys=nsys_binary
        )
        spec = with_job_tmpdir(spec, out_dir / NSYS_DIR / JOB_TMPDIR)
    code, _ = run_streaming(launch_argv(spec, run, out_dir, prefix, launch_options))
    shutil.rmtree(out_dir / NSYS_DIR / JOB_TMPDIR, ignore_errors=True)
    if code != 0:
        log.error("the profiled training run exited with %d", code)
        return code, None
    record = {
        **resolution.as_dict(),
        "world_size": run["world_size"],
        "start_step": run["profile"]["start_step"],
        "steps": run["profile"]["steps"],
        "run_dir": str(out_dir),
        "evidence": evidence(resolution.tool, out_dir, run["world_size"]),
    }
    return 0, record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.profiling.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--launch-json", required=True, help="launch spec (scalestudy.launch.launcher)")
    parser.add_argument("--run-config-json", required=True, help="the profile point's run config")
    parser.add_argument("--out-dir", required=True, type=Path, help="the run folder")
    parser.add_argument("--record", required=True, type=Path, help="where to record the tool used")
    parser.add_argument("--nsys", default="nsys", help="the nsys binary")
    parser.add_argument("--log", help="the rule's log, passed to the launcher (every attempt's is kept)")
    parser.add_argument("--attempt", type=int, help="Snakemake's attempt, passed to the launcher")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    launch_options = ["--log", args.log, "--attempt", str(args.attempt)] if args.log and args.attempt else []
    code, record = profile_run(
        json.loads(args.launch_json),
        json.loads(args.run_config_json),
        args.out_dir,
        args.nsys,
        launch_options,
    )
    if record is not None:
        write_json(args.record, record)
        log.info("recorded %s: tool %s", args.record, record["tool"])
    return code


if __name__ == "__main__":
    sys.exit(main())
