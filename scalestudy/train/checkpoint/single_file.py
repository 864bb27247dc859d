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
import logging
import re
from pathlib import Path
from typing import Any

import torch

from scalestudy import atomic
from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint.policy import FINISHED, differences, finished_mark, retried

FORMAT = 2  # 2: steady-state window in the history; finished runs mark or remove their checkpoints
KEEP = 2  # the newest and one previous, in case the newest turns out damaged
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


def supersede(directory: Path, newest: Path, config_hash: str) -> Path:
    """Another run config's checkpoints set aside (policy.supersede), this folder's retired."""
    return policy.supersede(directory, newest, config_hash, retire)


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
