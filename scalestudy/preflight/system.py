"""The system under test: what one node of the study is, written as results/system/<hostname>.json.

    python -m scalestudy.preflight.system describe --out-dir results/system --results-dir results \\
        --data-dir results/data [--launch-json SPEC] --index results/system/nodes_compute.json
    python -m scalestudy.preflight.system table --index results/system/nodes_*.json --out
    results/tables/system.csv

`describe` with a launch spec whose launcher resolves to srun (a Slurm job's batch step) runs
itself once per node (`srun --ntasks-per-node=1`, inside the image when the spec names one);
elsewhere it describes this machine. Each node records its CPU, memory, network, OS and
filesystems (preflight.machine), its GPUs, driver and topology (preflight.nvidia), the Slurm
version, torch, CUDA, cuDNN and NCCL versions, and the image and its sha256; `table` makes one row
of results/tables/system.csv per host (docs/reference/methods.md, "Pre-flight checks").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic, provenance
from scalestudy.launch import container_image as imagedigest
from scalestudy.launch import launcher as launch
from scalestudy.launch import slurm_job
from scalestudy.launch.container_image import IMAGE_ENV, IMAGE_SHA256_ENV
from scalestudy.preflight import common, machine, nvidia
from scalestudy.preflight.common import NONE

log = logging.getLogger("scalestudy.sysinfo")

GB = 1e9
# The columns of results/tables/system.csv (one row per host).
TABLE_COLUMNS = (
    "host",
    "kind",
    "cpu_model",
    "sockets",
    "cores",
    "logical_cpus",
    "numa_nodes",
    "memory_gb",
    "gpus",
    "gpu_model",
    "gpu_memory_gb",
    "gpu_power_limit_w",
    "gpu_driver",
    "cuda_driver",
    "gpu_topology",
    "infiniband",
    "network",
    "os",
    "kernel",
    "slurm",
    "results_fs",
    "results_free_gb",
    "data_fs",
    "data_free_gb",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "image_sha256",
    "timestamp",
    "git_commit",
)


def software() -> dict[str, Any]:
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401 - imported so that the CUDA, cuDNN and NCCL versions are read
    return provenance.software_versions()


def describe(results_dir: str, data_dir: str, kind: str, root: Path = Path("/")) -> dict[str, Any]:
    """This node's description, with its provenance (`root`: where /proc and /sys are)."""
    mounts = machine.read_text(root / "proc/mounts") or ""
    slurm = common.command_output(["sinfo", "--version"]) or common.command_output(["srun", "--version"])
    filesystems = {
        "results": machine.filesystem(results_dir, mounts),
        "data": machine.filesystem(data_dir, mounts),
    }
    record = {
        "host": socket.gethostname(),
        "kind": kind,
        "cpu": machine.cpu(root),
        # NVML lists every GPU the node's cgroup lets it see; the job's own are CUDA_VISIBLE_DEVICES
        "gpus": {**nvidia.gpus(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "topology": nvidia.topology(),
        "network": machine.network(root),
        "os": machine.operating_system(root),
        "slurm": {"version": slurm.strip() if slurm else None, **slurm_job.slurm_state()},
        "filesystems": filesystems,
        "software": software(),
        "image": {
            "path": os.environ.get(IMAGE_ENV),
            "sha256": os.environ.get(IMAGE_SHA256_ENV),
        },
    }
    return common.with_provenance(record)


# --------------------------------------------------------------------------- the table


def table_row(record: Mapping[str, Any]) -> dict[str, Any]:
    """One host's description as one row of results/tables/system.csv."""
    devices = record["gpus"].get("devices", [])
    first = devices[0] if devices else {}
    ib = record["network"]["infiniband"]
    nets = record["network"]["interfaces"]
    fs = record["filesystems"]
    soft = record["software"]
    return {
        "host": record["host"],
        "kind": record["kind"],
        "cpu_model": record["cpu"]["model"],
        "sockets": record["cpu"]["sockets"],
        "cores": record["cpu"]["cores"],
        "logical_cpus": record["cpu"]["logical_cpus"],
        "numa_nodes": record["cpu"]["numa_nodes"],
        "memory_gb": _gb(record["cpu"]["memory_bytes"]),
        "gpus": len(devices),
        "gpu_model": first.get("name", NONE),
        "gpu_memory_gb": _gb(first.get("memory_bytes")),
        "gpu_power_limit_w": first.get("power_limit_w"),
        "gpu_driver": record["gpus"].get("driver", NONE),
        "cuda_driver": record["gpus"].get("cuda_driver", NONE),
        "gpu_topology": record["topology"].get("summary", NONE),
        "infiniband": "; ".join(f"{p['device']}/{p['port']} {p['rate']} {p['state']}" for p in ib) or NONE,
        "network": "; ".join(
            f"{n['name']} {n['speed_mb_s'] / 1000:g} Gb/s" if n["speed_mb_s"] else f"{n['name']}"
            for n in nets
        )
        or NONE,
        "os": record["os"]["name"],
        "kernel": record["os"]["kernel"],
        "slurm": record["slurm"]["version"] or NONE,
        "results_fs": fs["results"]["fs_type"],
        "results_free_gb": _gb(fs["results"]["free_bytes"]),
        "data_fs": fs["data"]["fs_type"],
        "data_free_gb": _gb(fs["data"]["free_bytes"]),
        "torch": soft.get("torch"),
        "cuda": soft.get("cuda") or NONE,
        "cudnn": soft.get("cudnn") or NONE,
        "nccl": soft.get("nccl") or NONE,
        "image_sha256": record["image"]["sha256"] or NONE,
        "timestamp": record["provenance"]["timestamp"],
        "git_commit": record["provenance"]["git_commit"],
    }


def _gb(value) -> float | None:
    return round(value / GB, 1) if value else None


# --------------------------------------------------------------------------- command line


def per_node_command(
    spec: Mapping[str, Any], argv: Sequence[str], environ: Mapping[str, str]
) -> list[str] | None:
    """srun with one task per node of the spec (inside the image if it names one), re-running this
    command as `describe-here`; None where the launcher is local (describe this machine)."""
    full = launch.check_spec(spec)
    if launch.resolve_launcher(full, environ) != "srun":
        return None
    per_node = {**full, "world_size": full["nodes"], "tasks_per_node": 1}
    python = full["python"] if full["image"] else sys.executable
    container = launch.apptainer_args(per_node, os.getcwd())
    return [*launch.srun_args(per_node), *container, python, "-m", "scalestudy.preflight.system", *argv]


def _describe(args: argparse.Namespace) -> int:
    spec = json.loads(args.launch_json) if args.launch_json else {"world_size": 1, "launcher": "local"}
    here = ["describe-here", "--out-dir", args.out_dir, "--results-dir", args.results_dir]
    here += ["--data-dir", args.data_dir, "--kind", args.kind]
    command = per_node_command(spec, here, os.environ)
    if command is None:
        hosts = [_describe_here(args)]
    else:
        log.info("one task per node: %s", " ".join(command))
        image = spec.get("image")
        digest = imagedigest.recorded_sha256(image) if image else None  # never hashed here
        env = launch.build_env(spec, os.environ, digest)
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        sys.stderr.write(result.stderr)
        if result.returncode != 0:
            log.error("the per-node description failed (exit %d)", result.returncode)
            return result.returncode
        hosts = sorted(set(re.findall(r"^(?:\d+: )?HOST (\S+)$", result.stdout, re.M)))
    files = [str(Path(args.out_dir) / f"{host}.json") for host in hosts]
    atomic.write_json(args.index, {"kind": args.kind, "hosts": hosts, "files": files})
    log.info("system (%s): %s", args.kind, ", ".join(hosts))
    return 0


def _describe_here(args: argparse.Namespace) -> str:
    record = describe(args.results_dir, args.data_dir, args.kind)
    atomic.write_json(Path(args.out_dir) / f"{record['host']}.json", record)
    print(f"HOST {record['host']}", flush=True)
    gpu = record["gpus"]
    log.info(
        "%s: %s, %s logical CPUs, %s GPU(s)%s",
        record["host"],
        record["cpu"]["model"],
        record["cpu"]["logical_cpus"],
        len(gpu["devices"]),
        "" if gpu["available"] else f" ({gpu['reason']})",
    )
    return record["host"]


def _describe_here_command(args: argparse.Namespace) -> int:
    _describe_here(args)
    return 0


def _table(args: argparse.Namespace) -> int:
    records = common.read_records(
        path for index in common.read_records(args.index) for path in index["files"]
    )
    rows = (table_row(record) for record in sorted(records, key=lambda r: (r["kind"], r["host"])))
    common.write_table(args.out, TABLE_COLUMNS, rows)
    log.info("%d host(s) -> %s", len(records), args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, sub = common.command_parser("system", __doc__)
    for name in ("describe", "describe-here"):
        p = sub.add_parser(name, help="describe every node of the job" if name == "describe" else "this node")
        p.add_argument("--out-dir", required=True, help="where <hostname>.json goes")
        p.add_argument("--results-dir", default="results")
        p.add_argument("--data-dir", default="results/data")
        p.add_argument("--kind", default="compute", help="the node kind (compute, cpu)")
        if name == "describe":
            common.add_launch_json(p, "the job's shape (one task per node)", required=False)
            p.add_argument("--index", required=True, help="JSON listing the hosts described")
    common.add_table_command(sub, "--index", "the indexes of `describe`", "results/tables/system.csv")
    handlers = {"describe": _describe, "describe-here": _describe_here_command, "table": _table}
    return common.run_command(parser.parse_args(argv), handlers, "system")


if __name__ == "__main__":
    raise SystemExit(main())
