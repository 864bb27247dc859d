"""The command workload runner's helpers (scalestudy.workloads.command.runner): the results keys only
the script knows, the rank's device for the GPU monitor, the launch's name, and the runner's files
in checkpoint_dir (a line cut by a killed writer, another run config's files set aside, emptying)."""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import re
import shutil
from pathlib import Path
from typing import Any

from scalestudy.launch import slurm_job
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.plan.runfiles import SUPERSEDED  # another run config's checkpoint_dir content

log = logging.getLogger("scalestudy.workloads.command")


# The trainer's results keys that only the script knows.
UNKNOWN_TO_THE_RUNNER = (
    "compile_s",
    "inductor_cache_dir",
    "ddp_options",
    "backend",
    "precision_effective",
    "parameters",
    "forward_flops_per_image",
    "train_flops_per_image",
    "peak_lr",
)


def model_results(model: dict[str, Any]) -> dict[str, Any]:
    """What the script's "model" line says: its parameter count (the communication model's gradient
    bytes) and training FLOPs per sample (MFU), under the trainer's keys."""
    flops = model.get("train_flops_per_sample")
    known = {"parameters": model.get("parameters"), "train_flops_per_image": flops}
    if flops is not None:
        known["forward_flops_per_image"] = flops / 3
    return {key: value for key, value in known.items() if value is not None}


def rank_device(choice: str, local_rank: int):
    """The device the rank's script will use, for the GPU monitor: the trainer's choice
    (distributed.select_device) without making it current, so this process holds no CUDA context."""
    if choice == "cpu" or not _nvml_sees_a_gpu():
        if choice == "cuda":
            raise RunConfigError("run config device='cuda' but NVML sees no GPU on this node")
        return "cpu"
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    count = torch.cuda.device_count()
    return torch.device("cuda", 0 if count == 1 else local_rank)


def _nvml_sees_a_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: no GPU
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def device_name(device, monitor_report: dict[str, Any]) -> str:
    gpus = monitor_report.get("gpus") or []
    if gpus and gpus[0].get("name"):
        return gpus[0]["name"]
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or str(device)


def rebased(report: dict[str, Any], shift_s: float) -> dict[str, Any]:
    """A rank's monitor report on rank 0's clock (each rank's time_s counts from its own t0), the
    sightings of foreign processes on its GPUs included."""
    rows = [[row[0] + shift_s, *row[1:]] for row in report["rows"]]
    gpus = [
        {**gpu, "processes": _rebased_processes(gpu.get("processes"), shift_s)}
        for gpu in report.get("gpus", [])
    ]
    return {**report, "rows": rows} | ({"gpus": gpus} if "gpus" in report else {})


def _rebased_processes(processes: dict[str, Any] | None, shift_s: float) -> dict[str, Any] | None:
    if not processes:
        return processes
    spans = [
        {**span, "first_s": span["first_s"] + shift_s, "last_s": span["last_s"] + shift_s}
        for span in processes.get("foreign") or []
    ]
    return {**processes, "foreign": spans}


def launch_id(environ, config_hash: str) -> str:
    """One name for the ranks of one launch, different for the next: torchrun's run id, srun's
    job and step, else the rendezvous address with the Snakemake attempt."""
    if environ.get("TORCHELASTIC_RUN_ID"):
        name = f"torchrun-{environ['TORCHELASTIC_RUN_ID']}"
    elif environ.get("SLURM_JOB_ID"):
        name = f"slurm-{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', '0')}"
    else:
        address = f"{environ.get('MASTER_ADDR', '')}-{environ.get('MASTER_PORT', '')}"
        name = f"{address}-{environ.get(slurm_job.ATTEMPT_ENV, '')}-{config_hash}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def drop_cut_line(path: Path) -> None:
    """Remove a last line without its newline (a writer killed mid-line), so the next attempt's
    lines start on a line of their own."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        log.warning("%s: dropping a cut last line %r", path, data[data.rfind(b"\n") + 1 :][:120])
        with open(path, "r+b") as handle:
            handle.truncate(data.rfind(b"\n") + 1)


def supersede_folder(folder: Path, their_hash: str) -> Path:
    """Another run config's files in checkpoint_dir: moved into superseded/<its hash>/ (one kept
    per run config; superseded/ itself stays where it is). Returns that folder."""
    target = folder / SUPERSEDED / their_hash[:16]
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for entry in folder.iterdir():
        if entry.name != SUPERSEDED:
            entry.rename(target / entry.name)
    return target


def empty_folder(folder: Path) -> None:
    """Remove what `folder` holds but superseded/ (another run config's checkpoints, set aside)."""
    if folder.is_dir():
        for entry in folder.iterdir():
            if entry.name == SUPERSEDED:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink(missing_ok=True)


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
