"""The files a crate carries: which, their checksums, and how they are put into the crate folder and
the zip (hard links where the file system allows, so a study's data costs no copy).

A file matched by one of `crate.exclude`'s patterns (e.g. the fetched data of a large study) is not
carried: the crate describes it (path, size, sha256) without its bytes.
"""

from __future__ import annotations

import fnmatch
import mimetypes
import os
import shutil
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from scalestudy import atomic
from scalestudy.data import file_digests

# Compressed in the zip; everything else (arrays, images, PDFs, archives) is stored as it is.
TEXT_SUFFIXES = {".json", ".csv", ".tsv", ".log", ".txt", ".tex", ".md", ".smk", ".yaml", ".yml", ".html"}
TEXT_SUFFIXES |= {".bib", ".rst", ".py", ""}
MEDIA_TYPES = {".smk": "text/x-snakemake", ".tsv": "text/tab-separated-values", ".md": "text/markdown"}
MEDIA_TYPES |= {".log": "text/plain", ".tex": "text/x-tex", ".npy": "application/x-npy", ".yaml": "text/yaml"}


@dataclass(frozen=True)
class Payload:
    """One file of the study: its path relative to the workflow root, size and sha256."""

    path: str
    size: int
    sha256: str
    carried: bool = True

    @property
    def media_type(self) -> str:
        suffix = Path(self.path).suffix
        if self.path.endswith("Snakefile"):
            return "text/x-snakemake"
        return MEDIA_TYPES.get(suffix) or mimetypes.guess_type(self.path)[0] or "application/octet-stream"


# The empty file Snakemake leaves in a directory() output to date it: not the study's.
SNAKEMAKE_MARKER = ".snakemake_timestamp"


def _carried(path: Path) -> bool:
    return path.is_file() and path.name != SNAKEMAKE_MARKER


def expand(paths: Iterable[str], root: Path = Path()) -> list[str]:
    """Paths as files: a folder (a directory() output) gives the files under it, sorted (without
    Snakemake's marker)."""
    files = []
    for path in paths:
        full = root / path
        if full.is_dir():
            files += sorted(str(p.relative_to(root)) for p in full.rglob("*") if _carried(p))
        elif _carried(full):
            files.append(str(path))
    return sorted(set(files))


def describe(paths: Iterable[str], exclude: Iterable[str] = (), root: Path = Path()) -> dict[str, Payload]:
    """{path: Payload} of every existing file among `paths` (folders expanded)."""
    patterns = list(exclude)
    described = {}
    for path in expand(paths, root):
        full = root / path
        carried = not any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
        digest = file_digests(full, ("sha256",))["sha256"]
        described[path] = Payload(path, full.stat().st_size, digest, carried)
    return described


def place(files: Iterable[Payload], crate_dir: Path, root: Path = Path()) -> None:
    """Put the carried files into the crate folder: a hard link, else a copy."""
    for payload in files:
        if not payload.carried:
            continue
        target = crate_dir / payload.path
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(root / payload.path, target)
        except OSError:
            shutil.copy2(root / payload.path, target)


def write_zip(crate_dir: Path, zip_path: str | os.PathLike) -> None:
    """The crate folder as one zip (the folder's files at its root, without the marker Snakemake
    leaves in the folder, a directory() output), written atomically."""
    with atomic.atomic_path(zip_path) as tmp, zipfile.ZipFile(tmp, "w") as archive:
        for path in sorted(p for p in crate_dir.rglob("*") if _carried(p)):
            name = path.relative_to(crate_dir).as_posix()
            compress = zipfile.ZIP_DEFLATED if path.suffix in TEXT_SUFFIXES else zipfile.ZIP_STORED
            archive.write(path, name, compress_type=compress)
