"""What this machine is, from /proc and /sys: CPU model, sockets, cores, NUMA nodes and memory;
network interfaces and InfiniBand ports with their rate; the OS release; the filesystem, free
space and mount of a folder. The text parsers (parse_*, mount_of) are pure and tested with known
answers; every reader takes the filesystem's root, so a test can hand it a fake /proc and /sys."""

from __future__ import annotations

import os
import platform
import re
import shutil
from pathlib import Path
from typing import Any

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


# --------------------------------------------------------------------------- readers of this machine


def read_text(path: Path) -> str | None:
    """A /proc or /sys file's text, stripped; None where it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def cpu(root: Path = Path("/")) -> dict[str, Any]:
    info = parse_cpuinfo(read_text(root / "proc/cpuinfo") or "")
    model = info["model"] or platform.processor() or platform.machine()
    nodes = sorted(p.name for p in (root / "sys/devices/system/node").glob("node[0-9]*"))
    memory = parse_meminfo(read_text(root / "proc/meminfo") or "")
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
        speed = read_text(path / "speed")
        interfaces.append(
            {
                "name": path.name,
                "state": read_text(path / "operstate"),
                "speed_mb_s": int(speed)
                if speed and speed.lstrip("-").isdigit() and int(speed) > 0
                else None,
                "mtu": _int_or_none(read_text(path / "mtu")),
                "type": {"1": "ethernet", "32": "infiniband"}.get(
                    read_text(path / "type") or "", read_text(path / "type")
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
                    "rate": read_text(port / "rate"),
                    "state": read_text(port / "state"),
                    "phys_state": read_text(port / "phys_state"),
                    "link_layer": read_text(port / "link_layer"),
                }
            )
    return {"interfaces": interfaces, "infiniband": ports}


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def filesystem(path: str, mounts_text: str) -> dict[str, Any]:
    """The mount that holds `path` and its free and total bytes (of its nearest existing folder)."""
    real = os.path.realpath(path)
    probe = real
    while not os.path.exists(probe):  # a folder not made yet: its nearest existing parent
        probe = os.path.dirname(probe)
    usage = shutil.disk_usage(probe)
    return {"path": path, **mount_of(real, mounts_text), "free_bytes": usage.free, "total_bytes": usage.total}


def operating_system(root: Path = Path("/")) -> dict[str, Any]:
    return {
        "name": parse_os_release(read_text(root / "etc/os-release") or ""),
        "kernel": platform.release(),
        "machine": platform.machine(),
    }
