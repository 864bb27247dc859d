"""Checkpoints that reshard: torch.distributed.checkpoint (DCP) for DDP and FSDP2 alike.

A checkpoint is a folder `dcp-<step>/`: DCP's files (every rank writes its shards, rank 0 the
.metadata) and `trainer.pt` (rank 0: position, history, schedule, every rank's RNG state, the run
config). All ranks write into `.dcp-<step>.tmp/`; rank 0 then adds trainer.pt and renames the folder,
so a checkpoint folder is complete or absent; KEEP of them are kept.

DCP stores each tensor once by its fully qualified name, whatever the sharding, so a run saved at N
ranks resumes at M ranks: scalestudy.workloads.gpt.loader defines the data order by a global sample index,
so with the same global batch the resumed run sees the same batches. A checkpoint of the same run
config apart from the layout (RESHARD_KEYS) is resumed; one with another global batch is refused
(ReshardRefused: the optimisation and the data order would change); one of another run config is
removed with a warning, as in scalestudy.train.checkpoint.single_file, whose finished-run semantics this
follows.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from scalestudy import atomic, provenance
from scalestudy.launch import rendezvous as distributed
from scalestudy.train.checkpoint.single_file import differences

FORMAT = 1
KEEP = 2
TRAINER_STATE = "trainer.pt"
FINISHED = "finished.json"
RESHARD_KEYS = ("world_size", "per_gpu_batch", "nodes")  # may change on a resume; global_batch may not
_NAME = re.compile(r"^dcp-(\d{9})$")

log = logging.getLogger("scalestudy.checkpoint")


class ReshardRefused(ValueError):
    """The checkpoint would resume with another global batch."""


def resume_hash(config: dict[str, Any]) -> str:
    """The run config's hash without the keys a resume may change (the layout) and global_batch
    (compared on its own, for a clear message)."""
    return provenance.config_hash(
        {k: v for k, v in config.items() if k not in (*RESHARD_KEYS, "global_batch")}
    )


def _state_dicts(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


@contextlib.contextmanager
def _one_process_is_fine():
    """DCP warns when it runs without a process group (one rank with DDP): that is intended here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save(directory: str | Path, step: int, model, optimizer, trainer_state: dict[str, Any], is_main: bool):
    """Every rank calls this (a collective); returns the checkpoint folder."""
    import torch.distributed.checkpoint as dcp

    directory = Path(directory)
    final, tmp = directory / f"dcp-{step:09d}", directory / f".dcp-{step:09d}.tmp"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    distributed.barrier()
    with _one_process_is_fine():
        dcp.save(_state_dicts(model, optimizer), checkpoint_id=str(tmp))
    if is_main:  # dcp.save returns on rank 0 after every rank's shards and the .metadata are written
        buffer = io.BytesIO()
        torch.save({"format": FORMAT, **trainer_state}, buffer)
        atomic.write_bytes(tmp / TRAINER_STATE, buffer.getvalue())
        shutil.rmtree(final, ignore_errors=True)  # a retried run reaching the same step again
        tmp.rename(final)
        _prune(directory, final, step)
    return final


def load(path: str | Path, model, optimizer) -> None:
    """Every rank: the model's and optimizer's state from the checkpoint at `path`, in this run's
    sharding (DCP reshards)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state_dicts(model, optimizer)
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def latest(directory: str | Path) -> tuple[dict[str, Any], Path] | None:
    """(trainer state, folder) of the newest complete checkpoint; damaged ones are skipped."""
    for _, path in _candidates(Path(directory)):
        try:
            state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable checkpoint is skipped
            log.warning("skipping checkpoint %s: its %s does not load (%s)", path, TRAINER_STATE, error)
            continue
        if state.get("format") != FORMAT or not (path / ".metadata").is_file():
            log.warning("skipping checkpoint %s: not a complete format-%d checkpoint", path, FORMAT)
            continue
        return state, path
    return None


def claim(directory: str | Path, config: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """Rank 0: the checkpoint this run resumes from, or None (see the module docstring)."""
    directory = Path(directory)
    found = latest(directory)
    if found is None:
        if _candidates(directory):
            log.warning(
                "%s: no checkpoint in it loads; removed %d, starting from scratch",
                directory,
                retire(directory),
            )
        return None
    state, path = found
    theirs = state["run_config"]
    if state["resume_hash"] != resume_hash(config):
        reason = f"{path.name} was written by another run config ({differences(theirs, config)})"
    elif theirs["global_batch"] != config["global_batch"]:
        raise ReshardRefused(
            f"checkpoint {path} was written with global_batch={theirs['global_batch']} "
            f"({theirs['world_size']} ranks x {theirs['per_gpu_batch']}); this run has global_batch="
            f"{config['global_batch']} ({config['world_size']} x {config['per_gpu_batch']}): a resume keeps "
            f"the global batch (per_gpu_batch = {theirs['global_batch']} / world_size), "
            f"or remove {directory} to start over"
        )
    elif state["position"]["epoch"] >= config["epochs"] and (directory / FINISHED).is_file():
        reason = f"{path.name} ends a finished run: a re-run measures anew"
    else:
        if theirs["world_size"] != config["world_size"]:
            log.warning(
                "resharding %s: saved by %d ranks x %d, resumed by %d ranks x %d (global batch %d)",
                path,
                theirs["world_size"],
                theirs["per_gpu_batch"],
                config["world_size"],
                config["per_gpu_batch"],
                config["global_batch"],
            )
        return state, path
    log.warning(
        "%s: %s; removed %d checkpoint(s), starting from scratch", directory, reason, retire(directory)
    )
    return None


def finished(directory: str | Path, keep: bool) -> None:
    if keep:
        atomic.write_json(Path(directory) / FINISHED, {"format": FORMAT})
    else:
        retire(directory)


def retire(directory: str | Path) -> int:
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    checkpoints = [path for _, path in _candidates(directory)]
    for path in [*checkpoints, *directory.glob(".dcp-*.tmp")]:
        shutil.rmtree(path, ignore_errors=True)
    (directory / FINISHED).unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: someone else's files are kept
        directory.rmdir()
    return len(checkpoints)


def _candidates(directory: Path) -> list[tuple[int, Path]]:
    if not directory.is_dir():
        return []
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def _prune(directory: Path, newest: Path, step: int) -> None:
    """Keep `newest` and KEEP - 1 older ones; later steps (not resumed from) are stale."""
    others = [(s, p) for s, p in _candidates(directory) if p != newest]
    stale = [p for s, p in others if s >= step] + [p for s, p in others if s < step][KEEP - 1 :]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
