"""Nsight Systems: the per-rank profiling prefix, and `nsys stats` exports to CSV (stdlib only).

`nsys profile` must run *inside* srun (and inside the container), once per rank: `nsys profile
srun ...` would trace only the launcher. The prefix goes through `scalestudy.launch.launcher.build_command`'s
`rank_prefix`, and every rank writes its own report, `<dir>/<job>_r<rank>.nsys-rep`. The capture
is the trainer's profiling window (cudaProfilerStart/Stop, `--capture-range=cudaProfilerApi`);
`--capture-range-end=stop` lets the run finish and write its results after the window. No CPU
sampling (`--sample=none --cpuctxsw=none`), and every job gets its own TMPDIR (`run.with_job_tmpdir`):
nsys and ncu keep session files under $TMPDIR/nvidia, which another user's job on the node may own.

    python -m scalestudy.profiling.nsys export --record RUN/profile_tool.json --out-dir DIR

exports, per rank, `DIR/r<rank>_<report>.csv` for each of STATS_REPORTS and writes
`DIR/status.json`; when the run did not use nsys, only the status file, saying so.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

from scalestudy.atomic import write_json
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.profiling.nsys")

TRACE = "cuda,nvtx,osrt,cudnn,cublas"
KERNELS, MEMORY, NVTX, GPU_TRACE = "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "nvtx_sum", "cuda_gpu_trace"
STATS_REPORTS = (KERNELS, MEMORY, NVTX, GPU_TRACE)
REPORT_SUFFIX = ".nsys-rep"
_RANK_OF_REPORT = re.compile(r"_r(\d*)\.nsys-rep$")
STATUS_FILE = "status.json"


def rank_variable(launcher: str) -> str:
    """The environment variable holding a rank's number: Slurm's under srun, torchrun's otherwise."""
    return "SLURM_PROCID" if launcher == "srun" else "RANK"


def profile_prefix(
    report_dir: str | Path, rank_env: str, nsys: str = "nsys", trace: str = TRACE
) -> list[str]:
    """The `nsys profile ...` words put in front of each rank's trainer command."""
    return [
        nsys,
        "profile",
        "--trace",
        trace,
        # No CPU sampling or context-switch tracing: they add overhead and need perf_event access,
        # which many clusters restrict (perf_event_paranoid), and the breakdown does not use them.
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop",
        "--force-overwrite=true",
        "--output",
        f"{report_dir}/%q{{SLURM_JOB_ID}}_r%q{{{rank_env}}}",
    ]


def stats_prefix(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"r{rank}"


def stats_csv(out_dir: str | Path, rank: int, report: str) -> Path:
    """Where `nsys stats --output <prefix>` writes one report of one rank."""
    return Path(f"{stats_prefix(out_dir, rank)}_{report}.csv")


def stats_command(report: str | Path, out_prefix: str | Path, nsys: str = "nsys") -> list[str]:
    return [
        nsys,
        "stats",
        "--report",
        ",".join(STATS_REPORTS),
        "--format",
        "csv",
        "--output",
        str(out_prefix),
        "--force-overwrite=true",
        "--force-export=true",
        str(report),
    ]


def rank_reports(report_dir: str | Path, world_size: int) -> dict[int, Path]:
    """One report per rank, by rank; an error names what is missing or ambiguous."""
    reports = sorted(Path(report_dir).glob(f"*{REPORT_SUFFIX}"))
    by_rank: dict[int, list[Path]] = {}
    for report in reports:
        match = _RANK_OF_REPORT.search(report.name)
        digits = match.group(1) if match else ""
        rank = int(digits) if digits else (0 if world_size == 1 else -1)
        by_rank.setdefault(rank, []).append(report)
    problems = [
        f"rank {r}: {len(by_rank.get(r, []))} reports"
        for r in range(world_size)
        if len(by_rank.get(r, [])) != 1
    ]
    if -1 in by_rank:
        problems.append(f"reports without a rank number: {[p.name for p in by_rank[-1]]}")
    if problems:
        raise FileNotFoundError(
            f"{report_dir}: expected one {REPORT_SUFFIX} per rank for {world_size} ranks; "
            + "; ".join(problems)
        )
    return {rank: by_rank[rank][0] for rank in range(world_size)}


def export(record: dict, out_dir: Path, nsys: str = "nsys") -> dict:
    """Run `nsys stats` for every rank's report; return the status written beside the CSVs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if record["tool"] != "nsys":
        return {
            "exported": False,
            "tool": record["tool"],
            "reason": f"the profile run used {record['tool']}, not nsys",
        }
    binary = shutil.which(nsys)
    if binary is None:
        raise FileNotFoundError(
            f"the profile run used nsys, but {nsys!r} is not on PATH here to export its reports"
        )
    files = {}
    for rank, report in sorted(_reports_of(record).items()):
        command = stats_command(report, stats_prefix(out_dir, rank), nsys=binary)
        log.info("rank %d: %s", rank, " ".join(command))
        subprocess.run(command, check=True, stdout=sys.stderr)
        kernels = stats_csv(out_dir, rank, KERNELS)
        if not kernels.is_file():
            raise FileNotFoundError(
                f"{report}: nsys stats wrote no {kernels.name} (no CUDA kernels captured?)"
            )
        files[str(rank)] = sorted(p.name for p in out_dir.glob(f"r{rank}_*.csv"))
    return {"exported": True, "tool": "nsys", "reports": STATS_REPORTS, "files": files}


def _reports_of(record: dict) -> dict[int, Path]:
    reports = record.get("evidence", {}).get("nsys_reports")
    if not reports:
        raise ValueError("the run record lists no nsys reports (evidence.nsys_reports)")
    return {int(rank): Path(path) for rank, path in reports.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.profiling.nsys", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("export", help="nsys stats CSVs of every rank of one profile run")
    cmd.add_argument("--record", required=True, help="profile_tool.json written by scalestudy.profiling.run")
    cmd.add_argument("--out-dir", required=True, type=Path)
    cmd.add_argument("--nsys", default="nsys", help="the nsys binary")
    cmd.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper()))
    record = json.loads(Path(args.record).read_text())
    status = export(record, args.out_dir, nsys=args.nsys)
    write_json(args.out_dir / STATUS_FILE, status)
    log.info("nsys export: %s", status.get("reason") or f"{len(status['files'])} rank(s) exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())
