"""The site check's rules: what one rank's facts mean, as pure functions tested against known answers
(tests/test_sitecheck.py). The NVIDIA driver against the CUDA of the image's torch and the GPUs
torch sees (gpu_problem), NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME against the node's interfaces
(interface_problem), and the whole check's verdict from the ranks' reports (verdict). A problem is
one paragraph saying what to change in the config or on the site; preflight.site gathers the facts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from scalestudy.preflight.nvidia import DRIVER_VERSION_FILE

# The oldest driver of each CUDA major version that runs every minor release of it (CUDA minor
# version compatibility, NVIDIA's "CUDA Compatibility" guide).
MIN_DRIVER = {11: (450, 80, 2), 12: (525, 60, 13), 13: (580,)}
COMPAT_LIBRARIES = "/usr/local/cuda/compat"  # cuda-compat in the image (containers/scalestudy.def)
PYTORCH_WHEELS = "https://download.pytorch.org/whl/cu128"


# --------------------------------------------------------------------------- driver and GPUs


def parse_version(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); ValueError for anything else."""
    if not re.fullmatch(r"\d+(\.\d+)*", text.strip()):
        raise ValueError(f"not a version number: {text!r}")
    return tuple(int(part) for part in text.strip().split("."))


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
    """Why this rank cannot train on its GPUs, or None. `facts`: see preflight.site.gpu_facts."""
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


# --------------------------------------------------------------------------- the verdict


def collective_failure(error: BaseException) -> str:
    return (
        f"site check: the ranks could not initialise or use their process group: "
        f"{type(error).__name__}: {error}. If the ranks span nodes, set nccl: NCCL_SOCKET_IFNAME and "
        "GLOO_SOCKET_IFNAME in the config to the interface the nodes reach each other on (see "
        "docs/guide/cluster.md, 'Site check'), check that no firewall blocks ports 20000-29999 between "
        "nodes, and run once with nccl: NCCL_DEBUG: INFO to see what NCCL chose."
    )


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
