"""Checkpoints that are either whole or ignored, and resume from the newest good one.

A checkpoint is one file, `ckpt-<step>-<sha256 prefix>.pt`, written to a temporary name, fsynced
and renamed (scalestudy.atomic). The name carries the checksum of the content, so a file that was
cut short or damaged after the rename is recognised and skipped (with a warning) in favour of the
previous one; KEEP of them are kept. Files load with torch.load(weights_only=True): the state holds
only tensors and plain Python values (RNG states are converted accordingly).
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalestudy import atomic

FORMAT = 1
KEEP = 2  # the newest and one previous, in case the newest turns out damaged
_NAME = re.compile(r"^ckpt-(\d{9})-([0-9a-f]{16})\.pt$")

log = logging.getLogger("scalestudy.checkpoint")


class ConfigMismatch(RuntimeError):
    """The checkpoint was written by a run with a different run config."""


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


def check_config(state: dict[str, Any], config_hash: str, config: dict[str, Any], path: Path) -> None:
    """Refuse to resume from a checkpoint that a different run config wrote."""
    if state.get("config_hash") == config_hash:
        return
    theirs = state.get("run_config") or {}
    differing = sorted(key for key in set(theirs) | set(config) if theirs.get(key) != config.get(key))
    details = ", ".join(f"{key}: {theirs.get(key)!r} -> {config.get(key)!r}" for key in differing)
    raise ConfigMismatch(
        f"checkpoint {path} was written by run config {state.get('config_hash')}, this run's is "
        f"{config_hash} ({details or 'no key differs'}); delete {path.parent} to start from scratch"
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
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": np.asarray(numpy_state["state"]["key"], np.uint32)}
    np.random.set_state(numpy_state)
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
