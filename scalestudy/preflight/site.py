"""Fail fast on a wrong site: one cheap job per GPU partition, before any training job.

    python -m scalestudy.preflight.site run --launch-json J --backend B --device D --timeout-s T \
        --site NAME --out results/site/NAME.json

`run` starts two ranks (the study's smallest multi-rank layout: `cluster.launch_spec` for world
size 2) through `python -m scalestudy.launch`, exactly as a training job starts them (srun, the
image around each rank, the `nccl:` environment), each running `python -m scalestudy.preflight.site
rank` (the launcher's `--module`) instead of the trainer. Each rank checks, on its node and inside
the image:

1. that GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name network interfaces that exist there (gloo
   carries the trainer's control group on GPU runs too, not only CPU runs);
2. the host's NVIDIA driver against the CUDA of the image's torch (torch 2.14.1 from PyPI is a
   CUDA 13.0 build: driver >= 580), and that torch sees the GPUs the job was given;
3. that the process group (NCCL on GPUs, gloo on CPUs) and the gloo control group initialise and
   all-reduce across the ranks.

A failure exits 1 with one paragraph saying what to change (the job's log, and Snakemake's error);
a pass writes the ranks' reports and provenance to `--out`. This module gathers the facts and runs
the job; what they mean is decided in preflight.site_rules. torch is imported only by the rank.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic
from scalestudy.launch import distributed
from scalestudy.launch import launcher as launch
from scalestudy.plan import cluster, schema
from scalestudy.preflight import common, nvidia
from scalestudy.preflight.site_rules import (
    collective_failure,
    gpu_problem,
    gpu_warnings,
    interface_problem,
    interface_warnings,
    verdict,
)

log = logging.getLogger("scalestudy.sitecheck")

MODULE = "scalestudy.preflight.site"
IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
REPORT_PATTERN = "rank{rank}.json"


class SiteProblem(RuntimeError):
    """A site that cannot run the study; the message says what to change."""


# --------------------------------------------------------------------------- the rank's facts


def gpu_facts(expected_gpus: int) -> dict[str, Any]:
    """What this rank sees: driver, torch and its CUDA, visible GPUs (imports torch)."""
    import torch  # the rank only: the Snakefile imports this module

    available = torch.cuda.is_available()
    return {
        "host": socket.gethostname(),
        "expected_gpus": expected_gpus,
        "driver": nvidia.host_driver_version() if expected_gpus else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": available,
        "visible_gpus": torch.cuda.device_count() if available else 0,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else [],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def local_interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


# --------------------------------------------------------------------------- the rank


def collective_check(backend: str, device_kind: str, timeout_s: float) -> dict[str, Any]:
    """Join the process group and the gloo control group, all-reduce ones on both."""
    import torch  # the rank only: the Snakefile imports this module

    dist_env = distributed.from_environ()
    device = distributed.select_device(device_kind, dist_env.local_rank)
    backend = distributed.select_backend(backend, device)
    if dist_env.world_size == 1:  # a study without multi-rank points: nothing to join
        return {"backend": backend, "device": str(device), "rank": 0, "world_size": 1, "skipped": "one rank"}
    started = time.perf_counter()
    control = distributed.init_process_group(dist_env, backend, timeout_s, device)
    try:
        ones = torch.ones(1, device=device)
        distributed.all_reduce_sum(ones)
        control_ones = torch.ones(1)
        distributed.all_reduce_sum(control_ones, group=control)
        sums = (float(ones.item()), float(control_ones.item()))
    finally:
        distributed.destroy_process_group()
    if sums != (dist_env.world_size, dist_env.world_size):
        raise SiteProblem(
            f"site check: an all-reduce of ones over {dist_env.world_size} ranks gave {sums} "
            f"({backend} group, gloo control group) instead of {dist_env.world_size}: the collective "
            "library is broken on this node; run once with nccl: NCCL_DEBUG: INFO and read the log."
        )
    return {
        "backend": backend,
        "device": str(device),
        "rank": dist_env.rank,
        "world_size": dist_env.world_size,
        "launcher": dist_env.launcher,
        "init_and_all_reduce_s": round(time.perf_counter() - started, 3),
    }


def rank_check(expected_gpus: int, backend: str, device: str, timeout_s: float) -> dict[str, Any]:
    """Every check of one rank, in order: interfaces, GPUs, collectives (the first failure raises)."""
    host = socket.gethostname()
    interfaces = local_interfaces()
    report: dict[str, Any] = {
        "host": host,
        "interfaces": interfaces,
        "ifname": {name: os.environ.get(name) for name in IFNAME_VARIABLES},
        "warnings": interface_warnings(os.environ),
    }
    problem = interface_problem(os.environ, interfaces, host)
    if problem:
        raise SiteProblem(problem)
    try:
        facts = gpu_facts(expected_gpus)
    except Exception as error:  # ImportError, a broken CUDA library, ...
        raise SiteProblem(
            f"site check: the image's python could not import or query torch on {host}: "
            f"{type(error).__name__}: {error}. Check container.python and the image "
            "(apptainer test <sif> runs its %test), or rebuild it (rule build_image)."
        ) from error
    report["gpu"] = facts
    report["warnings"] += gpu_warnings(facts)
    problem = gpu_problem(facts)
    if problem:
        raise SiteProblem(problem)
    try:
        report["collective"] = collective_check(backend, device, timeout_s)
    except SiteProblem:
        raise
    except Exception as error:  # torch.distributed's errors: timeouts, NCCL, sockets
        raise SiteProblem(collective_failure(error)) from error
    return report


def rank_main(args: argparse.Namespace) -> int:
    report_dir = Path(args.report_dir)
    rank = os.environ.get("SLURM_PROCID") or os.environ.get("RANK") or "0"
    try:
        report = {"passed": True, **rank_check(args.expected_gpus, args.backend, args.device, args.timeout_s)}
        code = 0
    except SiteProblem as problem:
        report, code = {"passed": False, "host": socket.gethostname(), "problem": str(problem)}, 1
    except Exception as error:  # a bug here, or the report folder: still one line in the log
        problem = f"site check: unexpected {type(error).__name__} on {socket.gethostname()}: {error}"
        report, code = {"passed": False, "host": socket.gethostname(), "problem": problem}, 1
    atomic.write_json(report_dir / REPORT_PATTERN.format(rank=rank), report)
    print(f"sitecheck rank {rank}: {'passed' if code == 0 else report['problem']}", file=sys.stderr)
    return code


# --------------------------------------------------------------------------- the job


def site_name(partition: str | None) -> str:
    """The result file's name of a partition: the partition, or 'default' (the cluster's default)."""
    return partition or "default"


def job_resources(config: dict, world_size: int, attempt: int) -> dict[str, Any]:
    """A training job's Slurm resources for `world_size` ranks, with site_check.runtime_minutes and
    without the training jobs' `--signal` (whose lead may exceed the check's short wall time: its
    ranks have nothing to checkpoint and would die of the signal)."""
    resources = cluster.train_resources(config, world_size, attempt)
    extra = [option for option in shlex.split(resources["slurm_extra"]) if not option.startswith("--signal")]
    return {
        **resources,
        "runtime": config["site_check"]["runtime_minutes"],
        "slurm_extra": " ".join(shlex.quote(option) for option in extra),
    }


def rank_args(report_dir: str | Path, expected_gpus: int, args: argparse.Namespace) -> list[str]:
    """The arguments of `python -m scalestudy.preflight.site rank` on every rank."""
    options = {"--report-dir": report_dir, "--expected-gpus": expected_gpus, "--backend": args.backend}
    options.update({"--device": args.device, "--timeout-s": args.timeout_s})
    return ["rank", *(str(word) for pair in options.items() for word in pair)]


def read_reports(report_dir: Path) -> list[dict]:
    return common.read_records(sorted(report_dir.glob(REPORT_PATTERN.format(rank="*"))))


def run_main(args: argparse.Namespace) -> int:
    spec = launch.check_spec(json.loads(args.launch_json))
    deadline = args.timeout_s + 120  # the ranks' own timeout, plus start-up (srun, apptainer, torch)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{args.out.name}.", dir=args.out.parent) as scratch:
        ranks = rank_args(os.path.abspath(scratch), spec["gpus_per_node"], args)
        started = time.perf_counter()
        code, _ = common.run_logged(common.launch_argv(spec, ranks, module=MODULE), deadline)
        reports = read_reports(Path(scratch))
    for report in reports:
        log.info("rank report: %s", json.dumps(report, sort_keys=True))
    problem = verdict(code, reports, spec["world_size"], deadline)
    if problem:
        print(f"\n{problem}\n", file=sys.stderr)
        return 1
    result = {
        "site": args.site,
        "passed": True,
        "world_size": spec["world_size"],
        "nodes": spec["nodes"],
        "gpus_per_node": spec["gpus_per_node"],
        "seconds": round(time.perf_counter() - started, 1),
        "ranks": reports,
        "warnings": sorted({note for report in reports for note in report.get("warnings", [])}),
    }
    for note in result["warnings"]:
        log.warning("%s", note)
    common.write_record(args.out, result)
    log.info("site %s passed: %d ranks on %s", args.site, len(reports), sorted({r["host"] for r in reports}))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser, sub = common.command_parser("site", __doc__, log_level=False)  # after the subcommand
    run = sub.add_parser("run", help="start the ranks, collect their reports, pass or explain")
    common.add_launch_json(run, "world size 2")
    run.add_argument("--site", default="default", help="the partition's name, for the report")
    common.add_out(run, "the site's result (JSON)")
    rank = sub.add_parser("rank", help="one rank's checks (started by the launcher, --module)")
    rank.add_argument("--report-dir", required=True)
    rank.add_argument("--expected-gpus", type=int, default=0, help="GPUs the job was given per node")
    backend, device = schema.node("train", "backend"), schema.node("train", "device")
    timeout_s = float(schema.node("site_check", "timeout_s")["default"])
    for command in (run, rank):  # the study's train.backend and train.device, site_check.timeout_s
        command.add_argument("--backend", default=backend["default"], choices=backend["enum"])
        command.add_argument("--device", default=device["default"], choices=device["enum"])
        command.add_argument("--timeout-s", type=float, default=timeout_s)
        common.add_log_level(command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # a bad launch spec (launch.LaunchError) or JSON: exit 2, one line
    return common.run_command(_parser().parse_args(argv), {"rank": rank_main, "run": run_main}, "sitecheck")


if __name__ == "__main__":
    raise SystemExit(main())
