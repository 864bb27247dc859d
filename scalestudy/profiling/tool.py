"""Which profiler a profile run uses, decided at run time on the machine that runs it (stdlib only).

`auto` becomes `nsys` when an `nsys` binary is found (inside the run's container image when the
ranks run in one) *and* a CUDA GPU is visible *and* the run trains on the GPU; otherwise `torch`
(the torch.profiler fallback). An explicit `nsys` that cannot run is an error, never a silent
fallback. The reason for the choice is recorded with the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass

TOOLS = ("auto", "nsys", "torch")
PROBE_TIMEOUT_S = 120

Probe = Callable[[], tuple[bool, str]]


class ToolUnavailable(RuntimeError):
    """The requested profiler cannot run here."""


@dataclass(frozen=True)
class Resolution:
    requested: str
    tool: str
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def image_command(image: str | None, argv: list[str]) -> list[str]:
    """`argv` as run inside the container image, when there is one."""
    return ["apptainer", "exec", image, *argv] if image else list(argv)


def find_binary(name: str, image: str | None = None) -> tuple[bool, str]:
    """Whether `name` is on PATH (inside `image` when given), and where or why not."""
    if not image:
        path = shutil.which(name)
        return (True, path) if path else (False, f"{name} not found on PATH")
    if shutil.which("apptainer") is None:
        return False, f"apptainer not found on PATH (needed to look for {name} in {image})"
    argv = image_command(image, ["sh", "-c", f"command -v {name}"])
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"could not look for {name} in {image}: {error}"
    found = result.stdout.strip()
    return (
        (True, f"{found} in {image}")
        if result.returncode == 0 and found
        else (False, f"{name} not in {image}")
    )


def find_gpu() -> tuple[bool, str]:
    """Whether a CUDA GPU is visible to this job (nvidia-smi -L lists one)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False, "CUDA_VISIBLE_DEVICES hides every GPU"
    if shutil.which("nvidia-smi") is None:
        return False, "no CUDA GPU (nvidia-smi not found)"
    try:
        result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"no CUDA GPU (nvidia-smi -L failed: {error})"
    gpus = [line for line in result.stdout.splitlines() if line.startswith("GPU ")]
    if result.returncode != 0 or not gpus:
        return False, "no CUDA GPU (nvidia-smi -L lists none)"
    return True, f"{len(gpus)} GPU(s): {gpus[0]}"


def resolve(requested: str, device: str, nsys_probe: Probe, gpu_probe: Probe) -> Resolution:
    """The tool a run uses; `device` is the run config's device (auto, cpu, cuda)."""
    if requested not in TOOLS:
        raise ValueError(f"unknown profiling tool {requested!r} (one of {TOOLS})")
    if requested == "torch":
        return Resolution(requested, "torch", "requested in the config (profiling.tool: torch)")
    problem = _nsys_problem(device, nsys_probe, gpu_probe)
    if problem is None:
        return Resolution(requested, "nsys", "nsys and a CUDA GPU are present")
    if requested == "nsys":
        raise ToolUnavailable(f"profiling.tool is nsys, but {problem}")
    return Resolution(requested, "torch", f"auto: {problem}; using the torch.profiler fallback")


def _nsys_problem(device: str, nsys_probe: Probe, gpu_probe: Probe) -> str | None:
    if device == "cpu":
        return "the run trains on the CPU (train.device: cpu)"
    found, detail = nsys_probe()
    if not found:
        return detail
    found, detail = gpu_probe()
    return None if found else detail
