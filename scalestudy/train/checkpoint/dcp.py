"""Checkpoints that reshard: torch.distributed.checkpoint (DCP) for DDP and FSDP2 alike.

A checkpoint is a folder `dcp-<step>/`: DCP's files (every rank writes its shards, rank 0 the
.metadata) and `trainer.pt` (rank 0: position, history, schedule, every rank's RNG state, the run
config). All ranks write into `.dcp-<step>.tmp/`; rank 0 then adds trainer.pt and renames the folder,
so a checkpoint folder is complete or absent; KEEP of them are kept.

DCP stores each tensor once by its fully qualified name, whatever the sharding, so a run saved at N
ranks resumes at M ranks: scalestudy.workloads.gpt.loader defines the data order by a global sample index,
so with the same global batch the resumed run sees the same batches. A checkpoint of the same run
config apart from the layout (RESHARD_KEYS) is resumed; one with another global batch is refused
(ReshardRefused: the optimisation and the data order would change); the newest of another run
config is set aside under `superseded/<its hash>/` with a warning, as in
scalestudy.train.checkpoint.single_file, whose finished-run semantics this follows.

A damaged checkpoint (a shard cut short or missing, an unreadable trainer.pt or .metadata: see
`examine`) is named and moved to `damaged/`, and the one before it is tried: rank 0 decides and
hands its choice to every rank, so all ranks resume from the same one; only when none is left does
the run start over, saying so.
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
from scalestudy.launch import distributed
from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint.policy import (
    FINISHED,
    check_fits,
    differences,
    finished_mark,
    retried,
    set_aside,
)

FORMAT = 1
KEEP = 2
TRAINER_STATE = "trainer.pt"
RESHARD_KEYS = ("world_size", "per_gpu_batch", "nodes")  # may change on a resume; global_batch may not
_NAME = re.compile(r"^dcp-(\d{9})$")
DAMAGED = "damaged"  # checkpoint folders that cannot be resumed, set aside for inspection

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
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file() and p.name != TRAINER_STATE}
        buffer = io.BytesIO()
        torch.save({"format": FORMAT, **trainer_state, "files": files}, buffer)
        atomic.write_bytes(tmp / TRAINER_STATE, buffer.getvalue())
        shutil.rmtree(final, ignore_errors=True)  # a retried run reaching the same step again
        tmp.rename(final)
        _prune(directory, final, step)
    return final


def load(path: str | Path, model, optimizer) -> None:
    """Every rank: the model's and optimizer's state from the checkpoint at `path`, in this run's
    sharding (DCP reshards); CheckpointMismatch if its tensors do not fit the model."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _state_dicts(model, optimizer)
    metadata = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    saved = {
        name[len("model.") :]: getattr(item, "size", None)
        for name, item in metadata.items()
        if name.startswith("model.")
    }
    check_fits(path, saved, state["model"])  # DTensors' shapes are the global ones, as saved
    with _one_process_is_fine():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def latest(directory: str | Path) -> tuple[dict[str, Any], Path] | None:
    """(trainer state, folder) of the newest complete checkpoint; damaged ones are skipped."""
    for _, path in _candidates(Path(directory)):
        state, damage = examine(path)
        if damage is None:
            return state, path
        log.warning("skipping checkpoint %s: %s", path, damage)
    return None


def examine(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(trainer state, None) for a checkpoint folder that can be resumed, else (its trainer state
    where that loads, else None; what is wrong): its trainer.pt loads and is of this FORMAT, DCP's
    .metadata reads, every file it names exists and holds the bytes of its items, and every file has
    the size it had when it was saved (a shard cut short by a quota, a node lost while copying, or
    another checkpoint's file copied in). Sizes, not checksums: hashing every shard at every save
    would cost a pass over the whole model and optimizer state."""
    try:
        state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable checkpoint is skipped
        return None, f"its {TRAINER_STATE} does not load ({type(error).__name__}: {error})"
    if not isinstance(state, dict) or state.get("format") != FORMAT or not (path / ".metadata").is_file():
        return None, f"not a complete format-{FORMAT} checkpoint"
    try:
        import torch.distributed.checkpoint as dcp

        storage = dcp.FileSystemReader(str(path)).read_metadata().storage_data or {}
    except Exception as error:  # noqa: BLE001 - a damaged .metadata
        return state, f"its .metadata does not load ({type(error).__name__}: {error})"
    needed: dict[str, int] = dict(state.get("files") or {})
    for info in storage.values():
        end = info.offset + info.length
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        file = path / name
        found = file.stat().st_size if file.is_file() else None
        recorded = (state.get("files") or {}).get(name)
        if found is None:
            return state, f"{name} is missing"
        if found < size or (recorded is not None and found != recorded):
            return state, f"{name} has {found} bytes, but it was saved with {recorded or f'at least {size}'}"
    return state, None


def _newest_intact(directory: Path, ours: str) -> tuple[dict[str, Any], Path] | None:
    """claim's latest: the newest checkpoint that can be resumed, or the newest whose trainer.pt is
    another run config's (resume hash other than `ours`: claim sets it aside naming the difference,
    whatever its shards hold); a damaged one is named and set aside (damaged/), the one before it
    tried."""
    for _, path in _candidates(directory):
        state, damage = examine(path)
        if damage is None or (state is not None and state.get("resume_hash") != ours):
            return state, path
        if state is not None:  # our run config's trainer.pt, files it does not describe
            damage += f": the files do not match its {TRAINER_STATE} (another checkpoint's, or cut short)"
        moved = set_aside(path, directory / DAMAGED)
        log.warning(
            "checkpoint %s is damaged (%s): set aside as %s; trying the one before it", path, damage, moved
        )
    return None


def claim(directory: str | Path, config: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """Rank 0: the checkpoint this run resumes from, or None (see the module docstring)."""
    directory = Path(directory)
    had_any = bool(_candidates(directory))
    found = _newest_intact(directory, resume_hash(config))
    if found is None:
        if had_any:
            log.warning(
                "%s: no checkpoint in it can be resumed (see %s/): starting from scratch", directory, DAMAGED
            )
        return None
    state, path = found
    theirs = state["run_config"]
    if state["resume_hash"] != resume_hash(config):
        kept = supersede(directory, path, state["resume_hash"])
        log.warning(
            "%s: %s was written by another run config (%s): set aside as %s (delete it when it is not "
            "wanted); starting from scratch",
            directory,
            path.name,
            differences(theirs, config),
            kept,
        )
        return None
    if theirs["global_batch"] != config["global_batch"]:
        raise ReshardRefused(
            f"checkpoint {path} was written with global_batch={theirs['global_batch']} "
            f"({theirs['world_size']} ranks x {theirs['per_gpu_batch']}); this run has global_batch="
            f"{config['global_batch']} ({config['world_size']} x {config['per_gpu_batch']}): a resume keeps "
            f"the global batch (per_gpu_batch = {theirs['global_batch']} / world_size), "
            f"or remove {directory} to start over"
        )
    elif (
        state["position"]["epoch"] >= config["epochs"]
        and (directory / FINISHED).is_file()
        and not retried(directory)
    ):
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
    """As single_file.finished: marked finished with the job's attempt; without `keep` all but the
    newest go now, the newest when the run is asked for again."""
    directory = Path(directory)
    if not keep:
        for _, path in _candidates(directory)[1:]:
            shutil.rmtree(path, ignore_errors=True)
    atomic.write_json(directory / FINISHED, {"format": FORMAT, **finished_mark(None, keep)})


def retire(directory: str | Path) -> int:
    """Remove the checkpoint folders (and leftovers) of `directory`, and the folder if that empties
    it (superseded/ and damaged/ stay); returns how many were removed."""
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


def supersede(directory: Path, newest: Path, their_hash: str) -> Path:
    """Another run config's checkpoint folders set aside (policy.supersede), this folder's retired."""
    return policy.supersede(directory, newest, their_hash, retire)


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
