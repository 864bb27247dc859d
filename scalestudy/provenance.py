"""Provenance attached to every result: where, when, with what code and software it was made."""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from scalestudy.launch import gpus, slurm_job
from scalestudy.launch.container_image import IMAGE_ENV, IMAGE_SHA256_ENV

# The Snakefile exports these once per workflow run, so that jobs inside a container (no git) or
# on a compute node still record the commit and the image that the study was launched from.
GIT_COMMIT_ENV = "SCALESTUDY_GIT_COMMIT"
GIT_DIRTY_ENV = "SCALESTUDY_GIT_DIRTY"


def config_hash(config: Any) -> str:
    """A stable short hash of a JSON-able configuration (key order does not matter)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def git_state(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit and dirty flag: from the environment if the Snakefile set them, else from git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return {
            "git_commit": os.environ[GIT_COMMIT_ENV],
            "git_dirty": os.environ.get(GIT_DIRTY_ENV, "unknown") == "1",
        }
    repo = Path(repo or Path(__file__).resolve().parent.parent)
    try:
        if not tracks_workflow(repo):
            return {"git_commit": "unknown", "git_dirty": None}
        commit = _git(repo, "rev-parse", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--untracked-files=no", "--", "."))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return {"git_commit": "unknown", "git_dirty": None}
    return {"git_commit": commit, "git_dirty": dirty}


# The workflow's own files, relative to its folder: a commit is the workflow's only where git tracks
# them. A copy of the project exported into another repository that ignores it (or never added it)
# sits in that repository's work tree, and `git rev-parse HEAD` would name the other project's commit.
WORKFLOW_FILES = ("Snakefile", "scalestudy/provenance.py")


def tracks_workflow(repo: str | os.PathLike) -> bool:
    """Whether the git repository around `repo` tracks the workflow's own files that exist there."""
    present = [name for name in WORKFLOW_FILES if (Path(repo) / name).exists()]
    if not present:
        return False
    tracked = _git(Path(repo), "ls-files", "--", *present).splitlines()
    return len(tracked) == len(present)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=10
    ).stdout.strip()


def software_versions() -> dict[str, Any]:
    """Python, library, CUDA, cuDNN and NCCL versions.

    Library versions come from the installed metadata, so nothing is imported just to be named;
    the CUDA stack is read from torch only when this process already uses torch.
    """
    versions: dict[str, Any] = {"python": platform.python_version()}
    for package in ("torch", "torchvision", "numpy", "pandas", "matplotlib", "snakemake", "nvidia-ml-py"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = torch.__version__  # the build actually imported (e.g. +cu130)
        versions["cuda"] = torch.version.cuda
        versions["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        versions["nccl"] = _nccl_version(torch)
    return versions


def _nccl_version(torch) -> str | None:
    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a build without NCCL is recorded as such
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def collect(
    config: Any = None, seed: int | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Everything a result row needs to be traced back to how it was made."""
    record: dict[str, Any] = {
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": sys.argv,
        "seed": seed,
        "config_hash": config_hash(config) if config is not None else None,
        "image": os.environ.get(IMAGE_ENV),
        "image_sha256": os.environ.get(IMAGE_SHA256_ENV) or _recorded_image_sha256(),
        "scalestudy_version": __import__("scalestudy").__version__,
        **git_state(),
        "slurm": slurm_job.slurm_state(),
        # the job's GPUs and who gave them (scalestudy.launch.gpus: local-lock, slurm or none)
        "gpus": gpus.recorded(),
        "attempt": slurm_job.attempt(),
        "versions": software_versions(),
    }
    if extra:
        record.update(extra)
    return record


def _recorded_image_sha256() -> str | None:
    """The image's sha256 from rule image_digest's file (scalestudy.launch.container_image; never hashed
    here)."""
    from scalestudy.launch import container_image as imagedigest

    image = os.environ.get(IMAGE_ENV)
    return imagedigest.recorded_sha256(image) if image else None


def flatten(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted columns, for one CSV row per result."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list | tuple):
            flat[name] = json.dumps(value, default=str)
        else:
            flat[name] = value
    return flat


def export_git_state(repo: str | os.PathLike) -> None:
    """Put the workflow's commit in the environment once, for jobs that cannot run git."""
    if os.environ.get(GIT_COMMIT_ENV):
        return
    state = git_state(repo)
    os.environ[GIT_COMMIT_ENV] = state["git_commit"]
    os.environ[GIT_DIRTY_ENV] = {True: "1", False: "0"}.get(state["git_dirty"], "unknown")
