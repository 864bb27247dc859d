"""What both checkpoint formats (single_file: one file, the ResNet; dcp: folders that reshard, the
LM) do alike: the finished mark and what a retry of a finished job means, another run config's
checkpoint set aside under superseded/, the fit of a checkpoint to the model, and the random number
generators' states as weights_only-loadable values."""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalestudy.launch import slurm_job
from scalestudy.plan import runfiles
from scalestudy.plan.runconfig import RunConfigError

log = logging.getLogger("scalestudy.train")

FINISHED = runfiles.FINISHED_MARK  # the mark of a finished run (config hash, keep, Snakemake attempt)
SUPERSEDED = runfiles.SUPERSEDED  # another run config's newest checkpoint, set aside: superseded/<hash>/


def finished_mark(config_hash: str | None, keep: bool) -> dict[str, Any]:
    return {"config_hash": config_hash, "keep": keep, "attempt": slurm_job.attempt()}


def retried(directory: Path) -> bool:
    """Whether this job is a retry of the one that finished the run (a later Snakemake attempt of
    the same job): that attempt failed after writing its outputs (a stop during the final writes;
    the workflow removed them), so its last checkpoint is resumed to write them again, training no
    step. A run asked for again (a new workflow run: attempt 1) measures anew."""
    try:
        then = json.loads((directory / FINISHED).read_text()).get("attempt")
    except (OSError, ValueError, AttributeError):
        return False
    now = slurm_job.attempt()
    retry = isinstance(then, int) and now is not None and now > then
    if retry:
        log.warning(
            "%s: the run finished in attempt %d, but this is attempt %d of its job: its outputs were "
            "lost after they were written; resuming its last checkpoint to write them again",
            directory,
            then,
            now,
        )
    return retry


class CheckpointMismatch(RunConfigError):
    """A checkpoint of this run config whose tensors do not fit the model (the code changed)."""


def check_fits(path: str | Path, saved: dict[str, Any], model_state: dict[str, Any]) -> None:
    """CheckpointMismatch naming the checkpoint and the tensors whose names or shapes (`saved`:
    name -> shape) differ from the model's state dict."""
    wrong = [f"{name} is not in it" for name in model_state if name not in saved]
    wrong += [f"{name} is not in the model" for name in saved if name not in model_state]
    wrong += [
        f"{name} is {list(saved[name])} in it, {list(tensor.shape)} in the model"
        for name, tensor in model_state.items()
        if name in saved and saved[name] is not None and tuple(saved[name]) != tuple(tensor.shape)
    ]
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise CheckpointMismatch(
            f"checkpoint {path} does not fit the model: {'; '.join(wrong[:3])}{more}. It was saved by "
            "the same run config but another model (the code or the data's vocabulary changed): move it "
            "away to start over"
        )


def superseded(directory: str | Path) -> list[str]:
    """The other run configs' checkpoints set aside under `directory`/superseded/ (for the run
    catalog: results' superseded_checkpoints)."""
    folder = Path(directory) / SUPERSEDED
    return sorted(str(path) for path in folder.glob("*/*")) if folder.is_dir() else []


def set_aside(path: Path, folder: Path, name: str | None = None) -> Path:
    """Move a checkpoint (file or folder) into `folder` (created), replacing one of the same name."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (name or path.name)
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    target.unlink(missing_ok=True)
    path.rename(target)
    return target


def differences(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    differing = sorted(key for key in set(theirs) | set(ours) if theirs.get(key) != ours.get(key))
    return (
        ", ".join(f"{key}: {theirs.get(key)!r} -> {ours.get(key)!r}" for key in differing) or "no key differs"
    )


def supersede(directory: Path, newest: Path, config_hash: str, retire: Callable[[Path], int]) -> Path:
    """Another run config's checkpoints: the newest (a file or a folder) goes to
    `superseded/<its config hash>/` (which keeps one, the newest of that run config), the rest of the
    folder's checkpoints are retired by the format's `retire`. Returns where it went."""
    folder = directory / SUPERSEDED / config_hash[:16]
    if folder.is_dir():
        shutil.rmtree(folder)
    kept = set_aside(newest, folder)
    retire(directory)
    return kept


# --- random number generator states, as weights_only-loadable values -------------------------------


def rng_state() -> dict[str, Any]:
    numpy_state = np.random.get_state(legacy=False)
    numpy_state["state"]["key"] = numpy_state["state"]["key"].tolist()
    return {
        "python": random.getstate(),
        "numpy": numpy_state,
        "torch": torch.get_rng_state(),
        # this rank's device only: another attempt may see another number of devices
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": np.asarray(numpy_state["state"]["key"], np.uint32)}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"][0])  # the current device's (distributed.select_device)
