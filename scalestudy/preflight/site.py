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
a pass writes the ranks' reports and provenance to `--out`. The decision functions are pure and
tested against known answers (tests/test_sitecheck.py); torch is imported only by the rank.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic

log = logging.getLogger("scalestudy.sitecheck")

# The oldest driver of each CUDA major version that runs every minor release of it (CUDA minor
# version compatibility, NVIDIA's "CUDA Compatibility" guide).
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
COMPAT_LIBRARIES = "/usr/local/cuda/compat"  # cuda-compat in the image (containers/scalestudy.def)
PYTORCH_WHEELS = "https://download.pytorch.org/whl/cu128"
IFNAME_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
REPORT_PATTERN = "rank{rank}.json"


class SiteProblem(RuntimeError):
    """A site that cannot run the study; the message says what to change."""


# --------------------------------------------------------------------------- driver and GPUs


def parse_version(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); ValueError for anything else."""
    if not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        raise ValueError(f"not a version number: {text!r}")
    return tuple(int(part) for part in text.strip().split("."))


def driver_from_proc(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version (proprietary and open kernel modules)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match[1] if match else None


def host_driver_version() -> str | None:
    """The loaded NVIDIA kernel driver's version, or None on a node without one.

    /proc is the host's inside Apptainer, so this is the host driver even in the image."""
    try:
        found = driver_from_proc(Path(DRIVER_VERSION_FILE).read_text())
    except OSError:
        found = None
    if found:
        return found
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = result.stdout.split()
    return lines[0] if result.returncode == 0 and lines else None


def minimum_driver(torch_cuda: str) -> tuple[int, ...]:
    """The oldest driver that runs a torch built for `torch_cuda` ('13.0')."""
    major = parse_version(torch_cuda)[0]
    if major not in MIN_DRIVER:
        raise ValueError(f"no known minimum driver for CUDA {torch_cuda}")
    return MIN_DRIVER[major]


def driver_is_new_enough(driver: str, torch_cuda: str) -> bool:
    return parse_version(driver) >= minimum_driver(torch_cuda)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version) + ("" if len(version) > 1 else ".x")


def gpu_problem(facts: Mapping[str, Any]) -> str | None:
    """Why this rank cannot train on its GPUs, or None. `facts`: see `gpu_facts`."""
    expected = facts["expected_gpus"]
    if expected == 0:
        return None
    host, driver, torch_cuda = facts["host"], facts["driver"], facts["torch_cuda"]
    if driver is None:
        return (
            f"site check: the job asked for {expected} GPU(s) per node, but node {host} has no NVIDIA "
            f"driver ({DRIVER_VERSION_FILE} is missing and nvidia-smi does not answer). Set "
            "cluster.partition (and cluster.gpu_type / cluster.constraint) to a GPU partition, or "
            "cluster.gpus_per_node: 0 with train.device: cpu for a CPU-only run."
        )
    if not torch_cuda:
        return (
            f"site check: the image's torch {facts['torch']} is a CPU-only build (torch.version.cuda "
            f"is None), so it cannot use the {expected} GPU(s) per node the job was given on {host}. "
            "Rebuild the image from containers/scalestudy.def (its %test checks torch's CUDA), or "
            "point container.prebuilt at an image with a CUDA build of torch."
        )
    if not facts["cuda_available"] and not driver_is_new_enough(driver, torch_cuda):
        return driver_too_old(host, driver, facts["torch"], torch_cuda)
    if not facts["cuda_available"]:
        return (
            f"site check: torch {facts['torch']} (CUDA {torch_cuda}) sees no CUDA device on {host}, "
            f"although the driver {driver} is new enough and the job was given {expected} GPU(s) per "
            f"node (CUDA_VISIBLE_DEVICES={facts['cuda_visible_devices']!r}). Make sure "
            "container.apptainer_args contains --nv (it brings the driver into the image), that "
            "cluster.gpus_per_node / cluster.gpu_type match the partition's GRES, and that "
            "sbatch_extra hides no GPUs."
        )
    if facts["visible_gpus"] < expected:
        return (
            f"site check: torch sees {facts['visible_gpus']} GPU(s) on {host}, but the job asked for "
            f"{expected} per node (CUDA_VISIBLE_DEVICES={facts['cuda_visible_devices']!r}). Set "
            "cluster.gpus_per_node to the GPUs a node of cluster.partition really has, or "
            "cluster.ranks_per_node to fewer ranks per node."
        )
    return None


def driver_too_old(host: str, driver: str, torch_version: str, torch_cuda: str) -> str:
    """The message for a driver older than the image's torch needs, with the three remedies."""
    needed = _dotted(minimum_driver(torch_cuda))
    return (
        f"site check: the NVIDIA driver on {host} is {driver}, but the image's torch {torch_version} "
        f"is built for CUDA {torch_cuda} and needs a driver >= {needed}; Apptainer does not pass the "
        "host's LD_LIBRARY_PATH, so inside the image torch sees no CUDA device and every training job "
        f"would fail. Change one of: (1) run on nodes with a driver >= {needed} (another "
        "cluster.partition or cluster.constraint, or ask the admins to update the driver); (2) on "
        "data-centre GPUs (A100, H100, H200, L40S; not GeForce), use the CUDA forward-compatibility "
        f"libraries the image carries: export APPTAINERENV_LD_LIBRARY_PATH={COMPAT_LIBRARIES} in "
        "the shell that starts Snakemake; (3) rebuild the image with a torch built for the driver's "
        f"CUDA 12.x (PyTorch's cu126/cu128 wheels from {PYTORCH_WHEELS}, on an nvidia/cuda:12.x base "
        "image) in containers/scalestudy.def, or point container.prebuilt at such an image."
    )


def gpu_warnings(facts: Mapping[str, Any]) -> list[str]:
    """Things that work but are worth knowing (recorded in the report)."""
    notes = []
    driver, torch_cuda = facts["driver"], facts["torch_cuda"]
    if facts["cuda_available"] and driver and torch_cuda and not driver_is_new_enough(driver, torch_cuda):
        notes.append(
            f"driver {driver} is older than CUDA {torch_cuda} needs: torch runs on the CUDA "
            "forward-compatibility libraries (LD_LIBRARY_PATH)"
        )
    if facts["expected_gpus"] and facts["visible_gpus"] > facts["expected_gpus"]:
        notes.append(
            f"torch sees {facts['visible_gpus']} GPUs, the job asked for {facts['expected_gpus']}: "
            "Slurm does not confine the job to its GPUs (ConstrainDevices); ranks pick by local rank"
        )
    return notes


def gpu_facts(expected_gpus: int) -> dict[str, Any]:
    """What this rank sees: driver, torch and its CUDA, visible GPUs (imports torch)."""
    import torch

    available = torch.cuda.is_available()
    return {
        "host": socket.gethostname(),
        "expected_gpus": expected_gpus,
        "driver": host_driver_version() if expected_gpus else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": available,
        "visible_gpus": torch.cuda.device_count() if available else 0,
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if available
        else [],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


# --------------------------------------------------------------------------- network interfaces


def nccl_ifname_matches(value: str, interfaces: Sequence[str]) -> list[str]:
    """The interfaces NCCL may use for NCCL_SOCKET_IFNAME=value (NCCL's syntax: comma-separated
    prefixes; '=' exact names; '^' excludes the listed ones)."""
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    names = [item for item in (rest[1:] if exact else rest).split(",") if item]

    def listed(interface: str) -> bool:
        return any(interface == name if exact else interface.startswith(name) for name in names)

    return [interface for interface in interfaces if listed(interface) != exclude]


def gloo_ifname_missing(value: str, interfaces: Sequence[str]) -> list[str]:
    """The GLOO_SOCKET_IFNAME names (comma-separated, exact) that are not interfaces here."""
    return [name for name in value.split(",") if name and name not in interfaces]


def interface_problem(environ: Mapping[str, str], interfaces: Sequence[str], host: str) -> str | None:
    """Why NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME cannot work on this node, or None."""
    listing = ", ".join(interfaces) or "none"
    nccl = environ.get("NCCL_SOCKET_IFNAME", "")
    if nccl and not nccl_ifname_matches(nccl, interfaces):
        return (
            f"site check: NCCL_SOCKET_IFNAME={nccl!r} (from the config's nccl: section or the "
            f"environment) matches no network interface on {host} (it has: {listing}), so NCCL "
            "cannot bootstrap. Set nccl: NCCL_SOCKET_IFNAME in the config to the interface the nodes "
            "reach each other on (a prefix such as ib or eth, or =name for an exact name, ^lo,docker "
            "to exclude), or remove it to let NCCL choose."
        )
    gloo = environ.get("GLOO_SOCKET_IFNAME", "")
    missing = gloo_ifname_missing(gloo, interfaces) if gloo else []
    if missing:
        return (
            f"site check: GLOO_SOCKET_IFNAME={gloo!r} names {', '.join(missing)}, which node {host} "
            f"does not have (it has: {listing}). gloo carries the trainer's control group on GPU runs "
            "too, so set nccl: GLOO_SOCKET_IFNAME in the config to exact interface names that exist "
            "on every node and route between them (usually the one in NCCL_SOCKET_IFNAME), or remove it."
        )
    return None


def interface_warnings(environ: Mapping[str, str]) -> list[str]:
    if environ.get("NCCL_SOCKET_IFNAME") and not environ.get("GLOO_SOCKET_IFNAME"):
        return [
            "NCCL_SOCKET_IFNAME is set but GLOO_SOCKET_IFNAME is not: the gloo control group uses the "
            "interface of the host name, which may not route between nodes on a multi-homed cluster"
        ]
    return []


def local_interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


# --------------------------------------------------------------------------- the rank


def collective_check(backend: str, device_kind: str, timeout_s: float) -> dict[str, Any]:
    """Join the process group and the gloo control group, all-reduce ones on both."""
    import torch

    from scalestudy.launch import rendezvous as distributed

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


def collective_failure(error: BaseException) -> str:
    return (
        f"site check: the ranks could not initialise or use their process group: "
        f"{type(error).__name__}: {error}. If the ranks span nodes, set nccl: NCCL_SOCKET_IFNAME and "
        "GLOO_SOCKET_IFNAME in the config to the interface the nodes reach each other on (see "
        "docs/slurm.md, 'Site check'), check that no firewall blocks ports 20000-29999 between "
        "nodes, and run once with nccl: NCCL_DEBUG: INFO to see what NCCL chose."
    )


# --------------------------------------------------------------------------- the job


def site_name(partition: str | None) -> str:
    """The result file's name of a partition: the partition, or 'default' (the cluster's default)."""
    return partition or "default"


def job_resources(config: dict, world_size: int, attempt: int) -> dict[str, Any]:
    """A training job's Slurm resources for `world_size` ranks, with site_check.runtime_minutes and
    without the training jobs' `--signal` (whose lead may exceed the check's short wall time: its
    ranks have nothing to checkpoint and would die of the signal)."""
    from scalestudy.plan import cluster

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


def launch_argv(spec: dict, ranks: list[str]) -> list[str]:
    """The launcher, as a training job runs it, with this module instead of the trainer."""
    launcher = [sys.executable, "-m", "scalestudy.launch", "--launch-json", json.dumps(spec, sort_keys=True)]
    return [*launcher, "--module", "scalestudy.preflight.site", "--", *ranks]


def run_ranks(argv: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Run the launcher in its own process group; (exit code or None on timeout, its output)."""
    log.info("running: %s", " ".join(argv))
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=timeout_s)
            return proc.returncode, output
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
            return None, output


def read_reports(report_dir: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(report_dir.glob(REPORT_PATTERN.format(rank="*")))]


def verdict(code: int | None, reports: list[dict], world_size: int, timeout_s: float) -> str | None:
    """The one-paragraph problem of the whole check, or None when every rank passed."""
    failed = [report for report in reports if not report.get("passed")]
    if failed:
        return failed[0]["problem"]
    if code is None:
        return (
            f"site check: the {world_size} ranks did not finish within {timeout_s:.0f} s "
            f"({len(reports)} reported): the process group hung. If the ranks span nodes, set nccl: "
            "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to the interface the nodes reach each other on, "
            "and run once with nccl: NCCL_DEBUG: INFO."
        )
    if code != 0 or len(reports) < world_size:
        return (
            f"site check: the launcher exited with code {code} and {len(reports)} of {world_size} ranks "
            "reported; the log above says why (srun, apptainer or python not starting). Check "
            "cluster.partition / cluster.account, container.prebuilt or the built image, and "
            "container.python."
        )
    return None


def run_main(args: argparse.Namespace) -> int:
    from scalestudy import provenance
    from scalestudy.launch import launcher as launch

    spec = launch.check_spec(json.loads(args.launch_json))
    deadline = args.timeout_s + 120  # the ranks' own timeout, plus start-up (srun, apptainer, torch)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{args.out.name}.", dir=args.out.parent) as scratch:
        ranks = rank_args(os.path.abspath(scratch), spec["gpus_per_node"], args)
        started = time.perf_counter()
        code, output = run_ranks(launch_argv(spec, ranks), deadline)
        sys.stderr.write(output)
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
        "provenance": provenance.collect(),
    }
    for note in result["warnings"]:
        log.warning("%s", note)
    atomic.write_json(args.out, result)
    log.info("site %s passed: %d ranks on %s", args.site, len(reports), sorted({r["host"] for r in reports}))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.preflight.site", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="start the ranks, collect their reports, pass or explain")
    run.add_argument("--launch-json", required=True, help="cluster.launch_spec for world size 2")
    run.add_argument("--site", default="default", help="the partition's name, for the report")
    run.add_argument("--out", required=True, type=Path)
    rank = sub.add_parser("rank", help="one rank's checks (started by the launcher, --module)")
    rank.add_argument("--report-dir", required=True)
    rank.add_argument("--expected-gpus", type=int, default=0, help="GPUs the job was given per node")
    for command in (run, rank):
        command.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
        command.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
        command.add_argument("--timeout-s", type=float, default=180.0)
        command.add_argument("--log-level", default="INFO")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from scalestudy.progress import setup_logging

    setup_logging(getattr(logging, args.log_level.upper()))
    if args.command == "rank":
        return rank_main(args)
    try:
        return run_main(args)
    except ValueError as error:  # a bad launch spec (launch.LaunchError) or JSON
        print(f"sitecheck: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
