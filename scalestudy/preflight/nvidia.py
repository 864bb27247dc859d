"""What NVIDIA's driver and tools say about this node: the driver's version (/proc, nvidia-smi), every
GPU through NVML (pynvml, imported only when asked), and the GPU/NIC topology of `nvidia-smi topo
-m`. The text parsers (driver_from_proc, parse_topology) are pure and tested with known answers;
a node without a driver, NVML or nvidia-smi gives "none" and the reason, never an error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from scalestudy.preflight import common

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --------------------------------------------------------------------------- the driver


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
    output = common.command_output(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=60
    )
    lines = output.split() if output else []
    return lines[0] if lines else None


# --------------------------------------------------------------------------- NVML


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


# --------------------------------------------------------------------------- nvidia-smi topo -m


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
    return (
        "; ".join(f"{key} {', '.join(sorted(kinds))}" for key, kinds in pairs.items() if kinds) or common.NONE
    )


def topology() -> dict[str, Any]:
    """This node's `nvidia-smi topo -m`, parsed, with its summary and the raw text."""
    text = common.command_output(["nvidia-smi", "topo", "-m"])
    if text is None:
        return {
            "available": False,
            "reason": "nvidia-smi topo -m: not available here",
            "summary": common.NONE,
        }
    try:
        parsed = parse_topology(text)
    except ValueError as error:
        return {"available": False, "reason": str(error), "raw": text, "summary": common.NONE}
    return {"available": True, **parsed, "summary": topology_summary(parsed), "raw": text}
