"""Checkpoints that are either whole or ignored, and resume from the newest good one.

A checkpoint is one file, `ckpt-<step>-<sha256 prefix>.pt`, written to a temporary name, fsynced
and renamed (scalestudy.atomic). The name carries the checksum of the content, so a file that was
cut short or damaged after the rename is recognised and skipped (with a warning) in favour of the
previous one; KEEP of them are kept. Files load with torch.load(weights_only=True): the state holds
only tensors and plain Python values (RNG states are converted accordingly).

Checkpoints are the bookkeeping of one attempt chain (a run interrupted by a signal or a kill and
retried), not a cache of results: `claim` hands a run only a checkpoint of its own run config; one
written by another run config (an older version of the output, a typo in the config, two runs
pointed at one folder) is set aside, not deleted: the newest of each other run config is moved to
`superseded/<its config hash>/` beside them, for the user to resume by hand or delete. A run that has
written its run folder calls `finished`, which removes its checkpoints (or, where they are kept,
marks them finished): so a checkpoint at the end of the last epoch without that mark is a run
interrupted between its last checkpoint and its outputs, and resumes (to write them), while one with
the mark is a finished run asked for again, which measures anew, unless this job is a retry of the
attempt that finished it (`retried`: the outputs were lost with a failed attempt, e.g. a stop
during the final writes), which resumes it and trains no step again. So the newest checkpoint of a
finished run stays, marked, until the run is asked for again (without keep_checkpoints, the older
ones go at once). Checkpoints of an earlier FORMAT
(older code, whose finished runs left their last checkpoint unmarked) are never resumed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalestudy import atomic
from scalestudy.launch import slurm_job
from scalestudy.plan.runconfig import RunConfigError

FORMAT = 2  # 2: steady-state window in the history; finished runs mark or remove their checkpoints
FINISHED = "finished.json"  # the mark of a finished run (config hash, keep, Snakemake attempt)
KEEP = 2  # the newest and one previous, in case the newest turns out damaged
SUPERSEDED = "superseded"  # another run config's newest checkpoint, set aside: superseded/<hash>/
_NAME = re.compile(r"^ckpt-(\d{9})-([0-9a-f]{16})\.pt$")

log = logging.getLogger("scalestudy.checkpoint")


def save(directory: str | Path, state: dict[str, Any], step: int, keep: int = KEEP) -> Path:
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    data = buffer.getbuffer()
    path = Path(directory) / f"ckpt-{step:09d}-{_digest(data)}.pt"
    atomic.write_bytes(path, data)
    _prune(Path(directory), keep, path, step)
    return path


def load_latest(directory: str | Path) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint whose content matches its checksum and loads; None if there is none."""
    for _, path, digest in _candidates(Path(directory)):
        data = path.read_bytes()
        if _digest(data) != digest:
            log.warning("skipping checkpoint %s: its content does not match its checksum (cut short?)", path)
            continue
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, not fatal
            log.warning("skipping checkpoint %s: it does not load (%s)", path, error)
            continue
        if state.get("format") != FORMAT:
            log.warning(
                "skipping checkpoint %s: format %r, this code reads %r", path, state.get("format"), FORMAT
            )
            continue
        return state, path
    return None


def claim(
    directory: str | Path, config_hash: str, epochs: int, config: dict[str, Any] | None = None
) -> tuple[dict[str, Any], Path] | None:
    """The checkpoint an interrupted run of `config_hash` resumes from, or None: start from scratch.

    A checkpoint of another run config is set aside (supersede: the newest of each run config is
    kept under superseded/), one at the end of the last of `epochs` of a run marked finished and
    files none of which loads are removed; each with a warning naming them, and None is returned.
    An unmarked one at the end is resumed: the run stopped before writing its outputs.
    """
    directory = Path(directory)
    found = load_latest(directory)
    if found is None:
        if not _candidates(directory):
            return None
        reason = "none of its checkpoint files loads"
    else:
        state, path = found
        position = state.get("position") or {}
        if state.get("config_hash") != config_hash:
            kept = supersede(directory, path, str(state.get("config_hash")))
            log.warning(
                "%s: %s was written by run config %s, this run's is %s (%s): set aside as %s (delete "
                "it when it is not wanted); starting from scratch",
                directory,
                path.name,
                state.get("config_hash"),
                config_hash,
                differences(state.get("run_config") or {}, config or {}),
                kept,
            )
            return None
        elif (
            position.get("epoch", 0) >= epochs and (directory / FINISHED).is_file() and not retried(directory)
        ):
            reason = f"{path.name} ends a finished run ({epochs} of {epochs} epochs): a re-run measures anew"
        else:
            if position.get("epoch", 0) >= epochs:
                log.warning(
                    "%s ends the run but its outputs were never written: resuming to write them", path
                )
            return found
    removed = retire(directory)
    log.warning("%s: %s; removed %d checkpoint file(s), starting from scratch", directory, reason, removed)
    return None


def finished(directory: str | Path, config_hash: str, keep: bool) -> None:
    """A run has written its run folder: its checkpoints are marked finished, with this job's
    Snakemake attempt (see `retried`); without `keep` all but the newest go now, and the newest
    when the run is asked for again."""
    directory = Path(directory)
    if not keep:
        for _, path, _ in _candidates(directory)[1:]:
            path.unlink(missing_ok=True)
    atomic.write_json(directory / FINISHED, finished_mark(config_hash, keep))


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


def retire(directory: str | Path) -> int:
    """Remove the checkpoint files (leftover temporary files and the finished mark too) of
    `directory`, and the folder if that empties it; other files stay. Returns how many checkpoint
    files were removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return 0
    checkpoints = [path for _, path, _ in _candidates(directory)]
    for path in [*checkpoints, *directory.glob(".ckpt-*.tmp*"), directory / FINISHED]:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: someone else's files are kept
        directory.rmdir()
    return len(checkpoints)


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


def supersede(directory: Path, newest: Path, config_hash: str) -> Path:
    """Another run config's checkpoints: the newest goes to `superseded/<its config hash>/` (which
    keeps one, the newest of that run config), the rest of the folder's checkpoints are retired.
    Returns where it went."""
    folder = directory / SUPERSEDED / config_hash[:16]
    if folder.is_dir():
        shutil.rmtree(folder)
    kept = set_aside(newest, folder)
    retire(directory)
    return kept


def differences(theirs: dict[str, Any], ours: dict[str, Any]) -> str:
    differing = sorted(key for key in set(theirs) | set(ours) if theirs.get(key) != ours.get(key))
    return (
        ", ".join(f"{key}: {theirs.get(key)!r} -> {ours.get(key)!r}" for key in differing) or "no key differs"
    )


def _digest(data) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _candidates(directory: Path) -> list[tuple[int, Path, str]]:
    """(step, path, checksum) of the checkpoint files, newest first (by step, then by time)."""
    if not directory.is_dir():
        return []
    found = [
        (int(m[1]), p.stat().st_mtime_ns, p, m[2]) for p in directory.iterdir() if (m := _NAME.match(p.name))
    ]
    return [
        (step, path, digest) for step, _, path, digest in sorted(found, key=lambda f: f[:2], reverse=True)
    ]


def _prune(directory: Path, keep: int, newest: Path, step: int) -> None:
    """Keep `newest` and keep - 1 older steps. Files at its step or later are stale: a rewrite of the
    same step (a retried run reaching it again) or steps beyond that were not resumed from."""
    others = [(s, path) for s, path, _ in _candidates(directory) if path != newest]
    older = [path for s, path in others if s < step]
    for path in [path for s, path in others if s >= step] + older[keep - 1 :]:
        path.unlink(missing_ok=True)
    for stale in directory.glob(".ckpt-*.tmp*"):  # left by a writer that was killed
        stale.unlink(missing_ok=True)


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
