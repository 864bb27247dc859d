"""Read a crate (a folder or its zip) and check that every file it lists is there, with its sha256.

roc-validator checks the metadata against the profiles (scalestudy.crate.validation); this checks
the bytes: a file removed or changed after the crate was written is named, with the checksum the
crate recorded and the one found. scalestudy.compare checks a crate this way before reading it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from scalestudy.data import file_digests

METADATA = "ro-crate-metadata.json"


class CrateError(ValueError):
    """A crate that cannot be read, or whose files do not match what it recorded."""


def is_crate(path: str | os.PathLike) -> bool:
    path = Path(path)
    return (path.is_dir() and (path / METADATA).is_file()) or (path.is_file() and zipfile.is_zipfile(path))


@contextlib.contextmanager
def opened(path: str | os.PathLike) -> Iterator[Path]:
    """The crate's folder: the folder itself, or a zip extracted to a temporary folder (a CrateError
    raised inside names the zip, not that folder)."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not zipfile.is_zipfile(path):
        raise CrateError(f"{path}: neither a crate folder (with {METADATA}) nor a zip")
    with tempfile.TemporaryDirectory(prefix="scalestudy-crate-") as tmp:
        try:
            with zipfile.ZipFile(path) as archive:
                archive.extractall(tmp)
        except (OSError, zipfile.BadZipFile) as error:
            raise CrateError(f"{path}: unreadable zip ({error})") from None
        try:
            yield Path(tmp)
        except CrateError as error:  # named by the zip, not the folder it was extracted to
            raise CrateError(str(error).replace(tmp, str(path))) from None


def graph(crate_dir: Path) -> list[dict]:
    metadata = crate_dir / METADATA
    try:
        return json.loads(metadata.read_text())["@graph"]
    except FileNotFoundError:
        raise CrateError(f"{crate_dir}: no {METADATA}: not an RO-Crate") from None
    except (ValueError, KeyError, TypeError) as error:
        raise CrateError(f"{metadata}: not RO-Crate JSON-LD ({error})") from None


def _types(entity: dict) -> set[str]:
    kind = entity.get("@type", [])
    return {kind} if isinstance(kind, str) else set(kind)


def listed_files(crate_dir: Path) -> dict[str, str | None]:
    """{path in the crate: recorded sha256 or None} of every File data entity with a local @id."""
    files = {}
    for entity in graph(crate_dir):
        identifier = entity.get("@id", "")
        if "File" in _types(entity) and not identifier.startswith(("#", "http://", "https://")):
            files[identifier] = entity.get("sha256")
    return files


def problems(crate_dir: Path) -> list[str]:
    """One line per file that is missing or whose content does not match its recorded sha256."""
    found = []
    for name, recorded in sorted(listed_files(crate_dir).items()):
        path = crate_dir / name
        if not path.is_file():
            found.append(f"{name}: listed in {METADATA} but missing from the crate")
        elif recorded and file_digests(path, ("sha256",))["sha256"] != recorded:
            actual = file_digests(path, ("sha256",))["sha256"]
            found.append(f"{name}: sha256 {actual} differs from the {recorded} the crate recorded")
    return found


def verify(crate_dir: Path) -> None:
    """Raise CrateError naming every file that is missing or changed."""
    found = problems(crate_dir)
    if found:
        raise CrateError(
            f"{crate_dir}: {len(found)} file(s) do not match the crate:\n  " + "\n  ".join(found)
        )
