"""Nsight Compute on a one-GPU profile run: the top kernels of steady-state steps, achieved % of peak.

    python -m scalestudy.profiling.ncu run --launch-json J --run-config-json R --work-dir W \
        [--kernel-regex 'regex:...'] [--profile-record results/runs/profile/w1/profile_tool.json] \
        [--nsys-stats results/profile/w1/nsys_stats] [--loader-kernels] --top-kernels 10 \
        --launch-count 40 --status S.json --kernels K.csv --raw RAW.csv
    python -m scalestudy.profiling.ncu parse --raw RAW.csv --kernels K.csv

Which kernels `run` profiles:

- *when*: only inside the profile point's window of steady-state steps. The trainer opens it at
  `profile.start_step` (past cudnn autotuning, compilation and the first epoch's one-off work) with
  cudaProfilerStart and closes it after `profile.steps` steps (`scalestudy.train.ranges.ProfileWindow`);
  ncu runs with `--profile-from-start off`, so nothing before the window counts, and with
  `--nvtx --nvtx-include step` only kernels inside the trainer's NVTX `step` ranges (not evaluation,
  logging or checkpoints) are candidates. Those are start/end ranges (no trailing slash; `step/`
  would mean a push/pop range): process-wide, so the backward's kernels and the collectives that
  autograd's device thread launches count too (scalestudy.train.ranges.named_range). The loader's
  kernels, launched inside the `data` range at the start of each step, are left out with
  `--nvtx-exclude data` unless `--loader-kernels` (profiling.ncu.loader_kernels) asks for them:
  without it the first launches of every step (gather, fill, arange, the uint8 -> float copy) used
  up `--launch-count` before the model's first convolution;
- *which*: by function name (`--kernel-name-base function`), from
  scalestudy.profiling.kernel_choice: the configured `--kernel-regex`, else the `--top-kernels`
  kernels with the most GPU time in the profile run of the same one-GPU point (nsys's summary where
  nsys ran, else the trainer's torch.profiler kernel table, the loader's left out), else every kernel;
- at most `--launch-count` launches, each replayed with `--set basic --clock-control none` (the GPU
  keeps its own clocks, as in training): speed of light, launch statistics and occupancy, all the
  table reads. `--set full` replayed each launch 38 times on an H200 (2026-11-28): 40 launches took
  over 98 s, longer than the whole rest of the profile job.

The ncu prefix goes inside the one rank (`scalestudy.launch.launcher.build_command`'s rank prefix); the
report is exported with `ncu --import R --csv --page raw --print-units base` and parsed
(`parse_raw`). Counting launches from the process start (the former `launch_skip`) landed on
whatever kernel came N-th (cudnn.benchmark's trial launches count too) and is refused.

Without a GPU, without ncu, or when the counters are not accessible (ERR_NVGPUCTRPERM: counters
restricted to admin users; a DCGM exporter profiling the same GPU also blocks them), the outputs
say so: the status file holds `"ran": false` and the reason, the tables only their headers.

Stdlib only: it runs where the launcher runs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import shutil
import subprocess
import sys
from pathlib import Path

from scalestudy.atomic import write_json, write_text
from scalestudy.plan import grid, schema
from scalestudy.profiling.categorize import category
from scalestudy.profiling.kernel_choice import kernel_selection
from scalestudy.profiling.run import (
    JOB_TMPDIR,
    clear_checkpoints,
    launch_argv,
    run_streaming,
    with_job_tmpdir,
    with_profile_tool,
)
from scalestudy.profiling.schema import DATA_RANGE, NCU_COLUMNS, STEP_RANGE
from scalestudy.profiling.tool import find_binary, find_gpu, image_command
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.profiling.ncu")

# `ncu --page raw` metric names (Nsight Compute 2023.x-2025.x) of the Speed Of Light section.
DURATION = "gpu__time_duration.sum"
COMPUTE_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_PCT = (
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
)
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
GRID, BLOCK, REGISTERS = "launch__grid_size", "launch__block_size", "launch__registers_per_thread"
ID, NAME = "ID", "Kernel Name"
REQUIRED = (ID, NAME, DURATION, COMPUTE_PCT, MEMORY_PCT)
TIME_UNITS = {
    "nsecond": 1e-9,
    "ns": 1e-9,
    "usecond": 1e-6,
    "us": 1e-6,
    "msecond": 1e-3,
    "ms": 1e-3,
    "second": 1.0,
    "s": 1.0,
}
PERMISSION_ERROR = "ERR_NVGPUCTRPERM"
REPORT_NAME = "profile"
NCU_SET = "basic"  # SpeedOfLight, LaunchStats, Occupancy (and WorkloadDistribution): every column read


class NcuTableError(ValueError):
    """An ncu raw CSV that does not have the expected shape (names file and column)."""


# --- commands ------------------------------------------------------------------------------------


def profile_prefix(
    report: str | Path, kernel_regex: str, launch_count: int, ncu: str = "ncu", loader_kernels: bool = False
) -> list[str]:
    """The `ncu ...` words put in front of the one rank's trainer command (see the module doc)."""
    # start/end ranges: no trailing "/" (that selects push/pop ranges)
    loader = [] if loader_kernels else ["--nvtx-exclude", DATA_RANGE]
    return [
        ncu,
        "--target-processes",
        "all",
        "--profile-from-start",
        "off",
        "--nvtx",
        "--nvtx-include",
        STEP_RANGE,
        *loader,
        "--kernel-name-base",
        "function",
        "--kernel-name",
        kernel_regex,
        "--launch-count",
        str(launch_count),
        "--set",
        NCU_SET,
        "--clock-control",
        "none",
        "--export",
        str(report),
        "--force-overwrite",
    ]


# --- settings ------------------------------------------------------------------------------------

REMOVED_SETTINGS = {
    "launch_skip": (
        "counted launches from the process start and landed on whatever kernel came N-th; ncu now "
        "profiles kernels inside the trainer's NVTX 'step' ranges of the steady-state window "
        "(profiling.start_step, profiling.steps): remove it"
    ),
}


def check_settings(settings: dict) -> None:
    """Refuse settings of profiling.ncu that no longer exist, saying what replaced them."""
    for key, why in REMOVED_SETTINGS.items():
        if key in settings:
            raise ValueError(f"profiling.ncu.{key} ({settings[key]!r}) is no longer used: it {why}")


def export_command(report: str | Path, ncu: str = "ncu") -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-units", "base"]


# --- parsing -------------------------------------------------------------------------------------


def parse_raw(text: str, source: str = "<ncu raw csv>") -> list[dict]:
    """`ncu --csv --page raw` text -> one row per profiled kernel launch (schema.NCU_COLUMNS)."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, row in enumerate(rows) if {ID, NAME} <= {c.strip() for c in row}), None)
    if start is None:
        raise NcuTableError(
            f"{source}: no header line with {ID!r} and {NAME!r} (not `ncu --csv --page raw` output?)"
        )
    header = [c.strip() for c in rows[start]]
    missing = [column for column in REQUIRED if column not in header]
    if missing:
        raise NcuTableError(f"{source}: missing metric columns {missing} (profile with --set basic or full)")
    body = [row for row in rows[start + 1 :] if row]
    units = dict(zip(header, body[0], strict=False)) if body and not body[0][header.index(ID)].strip() else {}
    records = [dict(zip(header, row, strict=False)) for row in body if row[header.index(ID)].strip()]
    return [_kernel_row(record, units, source) for record in records]


def _kernel_row(record: dict, units: dict, source: str) -> dict:
    name = record[NAME]
    dram = next((column for column in DRAM_PCT if column in record), None)
    return {
        "tool": "ncu",
        "id": int(_number(record, ID, source)),
        "name": name,
        "category": category(name),
        "duration_s": _number(record, DURATION, source) * _time_scale(units.get(DURATION, ""), source),
        "compute_pct_of_peak": _number(record, COMPUTE_PCT, source),
        "memory_pct_of_peak": _number(record, MEMORY_PCT, source),
        "dram_pct_of_peak": _number(record, dram, source) if dram else math.nan,
        "achieved_occupancy_pct": _number(record, OCCUPANCY, source),
        "grid_size": _number(record, GRID, source),
        "block_size": _number(record, BLOCK, source),
        "registers_per_thread": _number(record, REGISTERS, source),
    }


def _number(record: dict, column: str, source: str) -> float:
    """A metric value; absent, empty or n/a -> NaN; thousands separators allowed."""
    text = str(record.get(column, "")).replace(",", "").strip()
    if text.lower() in ("", "n/a", "nan"):
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise NcuTableError(
            f"{source}: column {column!r}, kernel ID {record.get(ID)!r}: not a number: {text!r}"
        ) from None


def _time_scale(unit: str, source: str) -> float:
    unit = unit.strip()
    if unit not in TIME_UNITS:
        raise NcuTableError(
            f"{source}: column {DURATION!r} has unit {unit!r}, expected one of {sorted(TIME_UNITS)}"
        )
    return TIME_UNITS[unit]


def rows_to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=NCU_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


# --- the run -------------------------------------------------------------------------------------


def availability(run: dict, spec: dict, ncu: str) -> str | None:
    """Why ncu cannot run here, or None."""
    if run["world_size"] != 1:
        raise ValueError(f"ncu profiles a one-GPU run; this run has world_size {run['world_size']}")
    if run.get("device") == "cpu":
        return "the run trains on the CPU (train.device: cpu)"
    found, detail = find_binary(ncu, spec.get("image"))
    if not found:
        return detail
    found, detail = find_gpu()
    return None if found else detail


def counter_problem(lines: list[str]) -> str | None:
    """The reason ncu could not read the GPU counters, from its output."""
    if any(PERMISSION_ERROR in line for line in lines):
        return (
            f"{PERMISSION_ERROR}: GPU performance counters are restricted to admin users on this node "
            "(ask for NVreg_RestrictProfilingToAdminUsers=0 or a profiling partition)"
        )
    errors = [line.strip() for line in lines if line.lstrip().startswith("==ERROR==")]
    if errors:
        return f"ncu reported: {errors[0]} (a DCGM exporter profiling this GPU also blocks the counters)"
    return None


def ncu_run_config(run: dict) -> dict:
    """The profile point's run config for ncu: its window opened and closed with cudaProfilerStart/
    Stop (what ProfileWindow's "nsys" tool does), its own checkpoints."""
    return {
        **with_profile_tool(run, "nsys"),
        "checkpoint_dir": f"{grid.CHECKPOINTS_DIR}/profile/ncu_w{run['world_size']}",
    }


def profile(
    spec: dict, run: dict, work_dir: Path, options: argparse.Namespace
) -> tuple[int, dict, list[dict], str]:
    """(exit code, status, kernel rows, raw CSV text) of one ncu run."""
    reason = availability(run, spec, options.ncu)
    if reason is not None:
        return 0, not_run(reason), [], ""
    kernel_regex, chosen_by = kernel_selection(
        options.kernel_regex,
        options.profile_record,
        options.nsys_stats,
        options.top_kernels,
        options.loader_kernels,
    )
    log.info("ncu profiles %s: %s", chosen_by, kernel_regex)
    run = ncu_run_config(run)
    clear_checkpoints(run)
    report_file = (work_dir / REPORT_NAME).with_suffix(".ncu-rep")
    report_file.unlink(missing_ok=True)
    prefix = profile_prefix(
        work_dir / REPORT_NAME, kernel_regex, options.launch_count, options.ncu, options.loader_kernels
    )
    code, tail = _train_under(prefix, spec, run, work_dir, options)
    problem = counter_problem(tail)
    if problem is None and code != 0:
        log.error("the training run under ncu exited with %d", code)
        return code, {}, [], ""
    if problem is not None:
        return 0, not_run(problem), [], ""
    start, steps = run["profile"]["start_step"], run["profile"]["steps"]
    status = {
        "ran": True,
        "reason": None,
        "kernels": 0,
        "selection": chosen_by,
        "kernel_regex": kernel_regex,
        "loader_kernels": options.loader_kernels,
        "window": f"steps {start}..{start + steps - 1}",
    }
    if not report_file.is_file():
        status["reason"] = (
            f"no report: no kernel matched {kernel_regex!r} inside the NVTX '{STEP_RANGE}' ranges of "
            f"{status['window']}"
        )
        log.warning("ncu ran but profiled no kernels: %s", status["reason"])
        return 0, status, [], ""
    raw = subprocess.run(
        image_command(spec.get("image"), export_command(report_file, options.ncu)),
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = parse_raw(raw, str(report_file))
    return 0, {**status, "kernels": len(rows), "report": str(report_file), "command": prefix}, rows, raw


def _train_under(
    prefix: list[str], spec: dict, run: dict, work_dir: Path, options: argparse.Namespace
) -> tuple[int, list[str]]:
    """The profile point's training run with `prefix` in front of its one rank: exit code, last lines."""
    launch_options = ["--log", options.log, "--attempt", str(options.attempt)] if options.log else []
    spec = with_job_tmpdir(spec, work_dir / JOB_TMPDIR)
    try:
        return run_streaming(launch_argv(spec, run, work_dir / "run", prefix, launch_options))
    finally:
        shutil.rmtree(work_dir / JOB_TMPDIR, ignore_errors=True)


def not_run(reason: str) -> dict:
    log.warning("ncu not run: %s", reason)
    return {"ran": False, "reason": reason, "kernels": 0}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    if args.command == "parse":
        write_text(args.kernels, rows_to_csv(parse_raw(Path(args.raw).read_text(), str(args.raw))))
        return 0
    code, status, rows, raw = profile(
        json.loads(args.launch_json), json.loads(args.run_config_json), args.work_dir, args
    )
    if code != 0:
        return code
    write_text(args.raw, raw or ",".join(REQUIRED) + "\n")
    write_text(args.kernels, rows_to_csv(rows))
    write_json(args.status, status)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.profiling.ncu", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    settings = schema.defaults("profiling", "ncu")  # the study's profiling.ncu
    run = sub.add_parser("run", help="ncu on the one-GPU profile run, exported and parsed")
    run.add_argument("--launch-json", required=True)
    run.add_argument("--run-config-json", required=True)
    run.add_argument("--work-dir", required=True, type=Path, help="scratch: the run folder and the .ncu-rep")
    run.add_argument(
        "--kernel-regex", default=None, help="ncu --kernel-name (default: the profile's top kernels)"
    )
    run.add_argument(
        "--profile-record", type=Path, default=None, help="profile_tool.json of the one-GPU profile run"
    )
    run.add_argument("--nsys-stats", type=Path, default=None, help="nsys stats folder of the one-GPU run")
    run.add_argument(
        "--top-kernels", type=int, default=settings["top_kernels"], help="kernels taken from the profile"
    )
    run.add_argument(
        "--loader-kernels",
        action="store_true",
        help="profile the loader's kernels too (its NVTX 'data' ranges; left out by default)",
    )
    run.add_argument("--launch-count", type=int, default=settings["launch_count"])
    run.add_argument("--ncu", default="ncu", help="the ncu binary")
    run.add_argument("--log", help="the rule's log, passed to the launcher (every attempt's is kept)")
    run.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt, passed to the launcher")
    for name in ("status", "kernels", "raw"):
        run.add_argument(f"--{name}", required=True, type=Path)
    parse = sub.add_parser("parse", help="an `ncu --csv --page raw` file -> the kernels table")
    parse.add_argument("--raw", required=True, type=Path)
    parse.add_argument("--kernels", required=True, type=Path)
    for command in (run, parse):
        command.add_argument("--log-level", default="INFO")
    return parser


if __name__ == "__main__":
    sys.exit(main())
