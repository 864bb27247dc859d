"""The system under test: what one node of the study is, written as results/system/<hostname>.json.

    python -m scalestudy.preflight.system describe --out-dir results/system --results-dir results \\
        --data-dir results/data [--launch-json SPEC] --index results/system/nodes_compute.json
    python -m scalestudy.preflight.system table --index results/system/nodes_*.json --out
    results/tables/system.csv

`describe` with a launch spec whose launcher resolves to srun (a Slurm job's batch step) runs
itself once per node (`srun --ntasks-per-node=1`, inside the image when the spec names one);
elsewhere it describes this machine. Each node records: CPU model, sockets, cores, NUMA nodes and
memory (/proc, /sys); every GPU of the job through NVML (name, UUID, memory, enforced power limit,
driver and CUDA driver versions, clocks), or "none" and why; the GPU/NIC topology from `nvidia-smi
topo -m`; network interfaces (/sys/class/net) and InfiniBand ports with their rate
(/sys/class/infiniband); kernel, OS and Slurm versions; filesystem type and free space of the
results and data folders; torch, CUDA, cuDNN and NCCL versions; the image and its sha256.
Pure readers of text (parse_*) are unit-tested with known answers; no extra tool is needed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic, provenance
from scalestudy.launch import container_image as imagedigest
from scalestudy.launch import launcher as launch
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.sysinfo")

NONE = "none"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
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


# --------------------------------------------------------------------------- parsers (pure)


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """Model, sockets (physical ids), cores (distinct physical id/core id) and logical CPUs."""
    model, cores, sockets, logical = None, set(), set(), 0
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        logical += 1
        model = model or fields.get("model name") or fields.get("Model") or fields.get("cpu model")
        socket_id = fields.get("physical id", "0")
        sockets.add(socket_id)
        cores.add((socket_id, fields.get("core id", str(logical))))
    return {"model": model, "sockets": len(sockets) or None, "cores": len(cores) or None, "logical": logical}


def parse_meminfo(text: str) -> int | None:
    """MemTotal in bytes."""
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    return int(match[1]) * 1024 if match else None


def parse_os_release(text: str) -> str | None:
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', text, re.M)
    return match[1] if match else None


def mount_of(path: str, mounts_text: str) -> dict[str, str]:
    """The mount (device, mount point, filesystem type) that holds `path`: the longest prefix."""
    best, best_length = {"device": "unknown", "mount_point": "/", "fs_type": "unknown"}, -1
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best_length:  # a later mount on the same point shadows the earlier
            best, best_length = {"device": parts[0], "mount_point": point, "fs_type": parts[2]}, len(point)
    return best


def parse_topology(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m` as {devices, links: {a: {b: kind}}, affinity: {a: {column: value}}, nics,
    legend}. The matrix's header names the device columns (GPU0 .. NICk) then the affinity columns
    ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID"); fields are tab-separated (two or more spaces
    are accepted too); newer drivers underline the header with ANSI codes, which are dropped."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if re.match(r"^\s+GPU0\b", line)), None)
    if header_at is None:
        raise ValueError("nvidia-smi topo -m: no header line starting with GPU0")
    header = _fields(lines[header_at])
    devices = [name for name in header if re.fullmatch(r"(GPU|NIC|mlx\d*_?)\w*", name)]
    extra = header[len(devices) :]
    links: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    for line in lines[header_at + 1 :]:
        if not line.strip():
            break
        fields = _fields(line)
        name, values = fields[0], fields[1:]
        if name not in devices:
            continue
        links[name] = {other: value for other, value in zip(devices, values, strict=False) if other != name}
        affinity[name] = dict(zip(extra, values[len(devices) :], strict=False))
    nics = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", "\n".join(lines), re.M))
    legend = dict(re.findall(r"^\s*(X|SYS|NODE|PHB|PXB|PIX|NV#)\s+=\s+(.+)$", "\n".join(lines), re.M))
    return {"devices": devices, "links": links, "affinity": affinity, "nics": nics, "legend": legend}


def _fields(line: str) -> list[str]:
    parts = line.split("\t") if "\t" in line else re.split(r"\s{2,}", line)
    return [part.strip() for part in parts if part.strip()]


def topology_summary(topology: dict[str, Any]) -> str:
    """One line: the distinct GPU-GPU and GPU-NIC link kinds, e.g. 'GPU-GPU NV18; GPU-NIC PXB, SYS'."""
    pairs: dict[str, set[str]] = {"GPU-GPU": set(), "GPU-NIC": set()}
    for name, row in topology.get("links", {}).items():
        if not name.startswith("GPU"):
            continue
        for other, kind in row.items():
            pairs["GPU-GPU" if other.startswith("GPU") else "GPU-NIC"].add(kind)
    return "; ".join(f"{key} {', '.join(sorted(kinds))}" for key, kinds in pairs.items() if kinds) or NONE


# --------------------------------------------------------------------------- readers of this machine


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def cpu(root: Path = Path("/")) -> dict[str, Any]:
    info = parse_cpuinfo(_read(root / "proc/cpuinfo") or "")
    model = info["model"] or platform.processor() or platform.machine()
    nodes = sorted(p.name for p in (root / "sys/devices/system/node").glob("node[0-9]*"))
    memory = parse_meminfo(_read(root / "proc/meminfo") or "")
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "model": model,
        "sockets": info["sockets"],
        "cores": info["cores"],
        "logical_cpus": info["logical"] or os.cpu_count(),
        "cpus_usable_here": usable,
        "numa_nodes": len(nodes) or 1,
        "memory_bytes": memory,
    }


def network(root: Path = Path("/")) -> dict[str, Any]:
    """Interfaces of /sys/class/net (state, speed, MTU, type) and the ports of /sys/class/infiniband."""
    interfaces = []
    for path in sorted((root / "sys/class/net").glob("*")):
        if path.name == "lo":
            continue
        speed = _read(path / "speed")
        interfaces.append(
            {
                "name": path.name,
                "state": _read(path / "operstate"),
                "speed_mb_s": int(speed)
                if speed and speed.lstrip("-").isdigit() and int(speed) > 0
                else None,
                "mtu": _int_or_none(_read(path / "mtu")),
                "type": {"1": "ethernet", "32": "infiniband"}.get(
                    _read(path / "type") or "", _read(path / "type")
                ),
            }
        )
    ports = []
    for device in sorted((root / "sys/class/infiniband").glob("*")):
        for port in sorted((device / "ports").glob("*")):
            ports.append(
                {
                    "device": device.name,
                    "port": port.name,
                    "rate": _read(port / "rate"),
                    "state": _read(port / "state"),
                    "phys_state": _read(port / "phys_state"),
                    "link_layer": _read(port / "link_layer"),
                }
            )
    return {"interfaces": interfaces, "infiniband": ports}


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def gpus(nvml=None) -> dict[str, Any]:
    """Every GPU NVML sees on this node, or {"available": false, "reason": ...} ("none")."""
    try:
        nvml = nvml or __import__("pynvml")
        nvml.nvmlInit()
    except Exception as error:  # noqa: BLE001 - no library, no driver, no GPU: all say "none"
        return {"available": False, "reason": f"NVML unavailable: {error}", "devices": []}
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_driver = nvml.nvmlSystemGetCudaDriverVersion()
        devices = [
            _gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(i), i) for i in range(nvml.nvmlDeviceGetCount())
        ]
    finally:
        nvml.nvmlShutdown()
    return {
        "available": bool(devices),
        "reason": "" if devices else "NVML sees no GPU",
        "driver": driver,
        "cuda_driver": f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}",
        "devices": devices,
    }


def _gpu(nvml, handle, index: int) -> dict[str, Any]:
    def optional(function, *args):
        try:
            return function(handle, *args)
        except Exception:  # noqa: BLE001 - a field this GPU or driver does not report
            return None

    power = optional(nvml.nvmlDeviceGetEnforcedPowerLimit)
    clocks = {
        name: optional(nvml.nvmlDeviceGetMaxClockInfo, getattr(nvml, f"NVML_CLOCK_{name.upper()}"))
        for name in ("sm", "mem")
    }
    memory = optional(nvml.nvmlDeviceGetMemoryInfo)
    pci = optional(nvml.nvmlDeviceGetPciInfo)
    return {
        "index": index,
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "memory_bytes": getattr(memory, "total", None),
        "power_limit_w": power / 1000 if power is not None else None,
        "max_clock_sm_mhz": clocks["sm"],
        "max_clock_mem_mhz": clocks["mem"],
        "pci_bus_id": _text(getattr(pci, "busId", None)) if pci is not None else None,
    }


def _text(value) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def command_output(argv: Sequence[str], timeout: float = 30) -> str | None:
    """stdout of a tool, or None if it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def topology() -> dict[str, Any]:
    text = command_output(["nvidia-smi", "topo", "-m"])
    if text is None:
        return {"available": False, "reason": "nvidia-smi topo -m: not available here", "summary": NONE}
    try:
        parsed = parse_topology(text)
    except ValueError as error:
        return {"available": False, "reason": str(error), "raw": text, "summary": NONE}
    return {"available": True, **parsed, "summary": topology_summary(parsed), "raw": text}


def filesystem(path: str, mounts_text: str) -> dict[str, Any]:
    real = os.path.realpath(path)
    probe = real
    while not os.path.exists(probe):  # a folder not made yet: its nearest existing parent
        probe = os.path.dirname(probe)
    usage = shutil.disk_usage(probe)
    return {"path": path, **mount_of(real, mounts_text), "free_bytes": usage.free, "total_bytes": usage.total}


def software() -> dict[str, Any]:
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401 - imported so that the CUDA, cuDNN and NCCL versions are read
    return provenance.software_versions()


def describe(results_dir: str, data_dir: str, kind: str, root: Path = Path("/")) -> dict[str, Any]:
    mounts = _read(root / "proc/mounts") or ""
    slurm = command_output(["sinfo", "--version"]) or command_output(["srun", "--version"])
    return {
        "host": socket.gethostname(),
        "kind": kind,
        "cpu": cpu(root),
        # NVML lists every GPU the node's cgroup lets it see; the job's own are CUDA_VISIBLE_DEVICES
        "gpus": {**gpus(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
        "topology": topology(),
        "network": network(root),
        "os": {
            "name": parse_os_release(_read(root / "etc/os-release") or ""),
            "kernel": platform.release(),
            "machine": platform.machine(),
        },
        "slurm": {"version": slurm.strip() if slurm else None, **provenance.slurm_state()},
        "filesystems": {"results": filesystem(results_dir, mounts), "data": filesystem(data_dir, mounts)},
        "software": software(),
        "image": {
            "path": os.environ.get(provenance.IMAGE_ENV),
            "sha256": os.environ.get(provenance.IMAGE_SHA256_ENV),
        },
        "provenance": provenance.collect(),
    }


# --------------------------------------------------------------------------- the table


GB = 1e9


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


def write_table(records: Sequence[Mapping[str, Any]], out: str) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(TABLE_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for record in sorted(records, key=lambda r: (r["kind"], r["host"])):
        writer.writerow(table_row(record))
    atomic.write_text(out, buffer.getvalue())


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


def _table(args: argparse.Namespace) -> int:
    records = []
    for index in args.index:
        for path in json.loads(Path(index).read_text())["files"]:
            records.append(json.loads(Path(path).read_text()))
    write_table(records, args.out)
    log.info("%d host(s) -> %s", len(records), args.out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.preflight.system", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("describe", "describe-here"):
        p = sub.add_parser(name, help="describe every node of the job" if name == "describe" else "this node")
        p.add_argument("--out-dir", required=True, help="where <hostname>.json goes")
        p.add_argument("--results-dir", default="results")
        p.add_argument("--data-dir", default="results/data")
        p.add_argument("--kind", default="compute", help="the node kind (compute, cpu)")
        if name == "describe":
            p.add_argument("--launch-json", help="launch spec of the job's shape (one task per node)")
            p.add_argument("--index", required=True, help="JSON listing the hosts described")
    table = sub.add_parser("table", help="results/tables/system.csv from the indexes")
    table.add_argument("--index", nargs="+", required=True)
    table.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, str(args.log_level).upper(), logging.INFO))
    if args.command == "describe":
        return _describe(args)
    if args.command == "describe-here":
        _describe_here(args)
        return 0
    return _table(args)


if __name__ == "__main__":
    raise SystemExit(main())
