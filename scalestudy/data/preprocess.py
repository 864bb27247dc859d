"""Pack the CIFAR-10 archive's batch files into memory-mappable arrays for the trainer.

    python -m scalestudy.data.preprocess --archive results/data/cifar-10-python.tar.gz \\
        --out-dir results/data/packed

writes {train,test}_images.npy (uint8 [N, 32, 32, 3], HWC), {train,test}_labels.npy (int64 [N])
and manifest.json (counts, class histograms, label names, sha256 of the archive and of every
output, provenance). The archive is validated completely before anything is written; an error
names the archive member and what is wrong with it, and leaves no output behind.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import math
import os
import sys
import tarfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalestudy import provenance
from scalestudy.atomic import atomic_path, write_json
from scalestudy.data import cifar_format as fmt
from scalestudy.data import file_digests
from scalestudy.plan.paths import PACKED_MANIFEST as MANIFEST
from scalestudy.progress import Progress, setup_logging

log = logging.getLogger("scalestudy.data.preprocess")

SPLITS = ("train", "test")
SPLIT_BATCHES = {"train": fmt.TRAIN_BATCHES, "test": (fmt.TEST_BATCH,)}
_READ_CHUNK = 1 << 20


class ArchiveError(Exception):
    """The archive is unreadable or not valid CIFAR-10 data; the message says where and why."""


@dataclass(frozen=True)
class Split:
    images: np.ndarray  # uint8 [N, 32, 32, 3]
    labels: np.ndarray  # int64 [N]
    batch_sizes: dict[str, int]


@dataclass(frozen=True)
class CifarData:
    label_names: list[str]
    splits: dict[str, Split]


def output_names(split: str) -> tuple[str, str]:
    """The images and labels file names of a split."""
    return f"{split}_images.npy", f"{split}_labels.npy"


# ---------------------------------------------------------------------------------------------
# Reading and validating.


def read_archive(archive: str | os.PathLike) -> CifarData:
    """Read and validate every batch of a cifar-10-python.tar.gz; raise ArchiveError if anything is off."""
    archive = Path(archive)
    payloads = _read_members(archive)
    label_names = _parse_meta(payloads[fmt.META], _Where(archive, fmt.META))
    splits = {split: _read_split(payloads, batches, archive) for split, batches in SPLIT_BATCHES.items()}
    return CifarData(label_names, splits)


@dataclass(frozen=True)
class _Where:
    archive: Path
    name: str

    def error(self, problem: str) -> ArchiveError:
        return ArchiveError(f"{self.archive}: member {fmt.member_path(self.name)}: {problem}")


def _read_members(archive: Path) -> dict[str, bytes]:
    """The contents of the batch and meta members, read in one pass over the compressed stream."""
    wanted = {fmt.member_path(name): name for name in (fmt.META, *fmt.TRAIN_BATCHES, fmt.TEST_BATCH)}
    if not archive.is_file():
        raise ArchiveError(f"{archive}: no such file")
    progress = Progress(f"read {archive.name}", len(wanted), unit="members", logger=log)
    found: dict[str, bytes] = {}
    try:
        with gzip.open(archive, "rb") as unzipped:
            with tarfile.open(fileobj=unzipped, mode="r|") as tar:
                for info in tar:
                    name = wanted.get(info.name.removeprefix("./"))
                    if name is not None and info.isfile():
                        found[name] = tar.extractfile(info).read()
                        progress.advance()
            while unzipped.read(_READ_CHUNK):  # on to the gzip trailer, whose CRC and length catch damage
                pass
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise ArchiveError(f"{archive}: not a readable .tar.gz (truncated or corrupt): {error}") from error
    missing = [member for member, name in wanted.items() if name not in found]
    if missing:
        raise ArchiveError(f"{archive}: missing member(s): {', '.join(missing)}")
    return found


def _unpickle(payload: bytes, where: _Where) -> dict[str, Any]:
    try:
        entry = fmt.load_pickle(payload)
    except fmt.ForbiddenGlobal as error:
        raise where.error(f"refused to unpickle: {error}") from error
    except Exception as error:  # a damaged pickle fails in many ways (EOFError, ValueError, ...)
        raise where.error(
            f"not a valid pickle (truncated or corrupt): {type(error).__name__}: {error}"
        ) from error
    if not isinstance(entry, dict):
        raise where.error(f"expected a pickled dict, found {type(entry).__name__}")
    return fmt.text_keys(entry)


def _parse_meta(payload: bytes, where: _Where) -> list[str]:
    names = _unpickle(payload, where).get("label_names")
    if not isinstance(names, list) or not all(isinstance(name, str | bytes) for name in names):
        raise where.error("'label_names' is missing or not a list of names")
    names = [name.decode("latin1") if isinstance(name, bytes) else name for name in names]
    if len(names) != fmt.NUM_CLASSES or len(set(names)) != len(names):
        raise where.error(f"expected {fmt.NUM_CLASSES} distinct label names, found {names}")
    return names


def _read_split(payloads: dict[str, bytes], batches: Sequence[str], archive: Path) -> Split:
    rows, labels = zip(
        *(_parse_batch(payloads[name], _Where(archive, name)) for name in batches), strict=True
    )
    sizes = {name: len(batch_labels) for name, batch_labels in zip(batches, labels, strict=True)}
    if not sum(sizes.values()):
        raise ArchiveError(f"{archive}: {', '.join(batches)} hold no images")
    return Split(fmt.rows_to_images(np.concatenate(rows)), np.concatenate(labels), sizes)


def _parse_batch(payload: bytes, where: _Where) -> tuple[np.ndarray, np.ndarray]:
    """(rows uint8 [N, 3072], labels int64 [N]) of one batch member, validated."""
    entry = _unpickle(payload, where)
    for key in ("data", "labels"):
        if key not in entry:
            raise where.error(f"no '{key}' entry (keys: {sorted(map(str, entry))})")
    rows = _validated_rows(entry["data"], where)
    return rows, _validated_labels(entry["labels"], len(rows), where)


def _validated_rows(data: Any, where: _Where) -> np.ndarray:
    if not isinstance(data, np.ndarray):
        raise where.error(f"'data' is a {type(data).__name__}, expected a numpy array")
    if data.dtype != np.uint8:
        raise where.error(f"'data' has dtype {data.dtype}, expected uint8")
    if data.ndim != 2 or data.shape[1] != fmt.ROW_LENGTH:
        raise where.error(f"'data' has shape {data.shape}, expected (N, {fmt.ROW_LENGTH})")
    return data


def _validated_labels(raw: Any, count: int, where: _Where) -> np.ndarray:
    labels = np.asarray(raw)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise where.error(
            f"'labels' must be a flat sequence of integers, found {labels.dtype} {labels.shape}"
        )
    if len(labels) != count:
        raise where.error(f"{len(labels)} labels for {count} images in 'data'")
    outside = np.flatnonzero((labels < 0) | (labels >= fmt.NUM_CLASSES))
    if outside.size:
        index = int(outside[0])
        raise where.error(
            f"label {labels[index]} at index {index} is outside 0..{fmt.NUM_CLASSES - 1}"
            f" ({outside.size} of {len(labels)} labels out of range)"
        )
    return labels.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Writing.


def preprocess(archive: str | os.PathLike, out_dir: str | os.PathLike) -> dict[str, Any]:
    """Validate `archive`, then write the packed arrays and manifest.json to `out_dir`; return the manifest.

    Nothing is written unless the whole archive is valid. The manifest goes last: its presence
    means the arrays beside it are complete and belong to it.
    """
    archive, out_dir = Path(archive), Path(out_dir)
    data = read_archive(archive)
    arrays = {
        name: array
        for split in SPLITS
        for name, array in zip(
            output_names(split), (data.splits[split].images, data.splits[split].labels), strict=True
        )
    }
    with contextlib.ExitStack() as renames:  # every file renamed into place only if all were written
        temporary = {
            name: renames.enter_context(atomic_path(out_dir / name, suffix=".npy")) for name in arrays
        }
        for name, path in temporary.items():
            np.save(path, arrays[name])
        manifest = _manifest(archive, data, {name: (path, arrays[name]) for name, path in temporary.items()})
        (out_dir / MANIFEST).unlink(missing_ok=True)  # an old manifest must not vouch for new arrays
    write_json(out_dir / MANIFEST, manifest)
    log.info("wrote %s: %s", out_dir, ", ".join(f"{s} {len(data.splits[s].labels)} images" for s in SPLITS))
    return manifest


def _manifest(archive: Path, data: CifarData, files: dict[str, tuple[Path, np.ndarray]]) -> dict[str, Any]:
    archive_sha256 = file_digests(archive, ("sha256",))["sha256"]
    return {
        "archive": {"path": str(archive), "sha256": archive_sha256, "bytes": archive.stat().st_size},
        "label_names": data.label_names,
        "image_layout": "uint8 [N, 32, 32, 3] (HWC); labels int64 [N]",
        "splits": {split: _split_record(data.splits[split], data.label_names) for split in SPLITS},
        "files": {name: _file_record(path, array) for name, (path, array) in files.items()},
        "provenance": provenance.collect(extra={"archive_sha256": archive_sha256}),
    }


def _split_record(split: Split, label_names: list[str]) -> dict[str, Any]:
    histogram = np.bincount(split.labels, minlength=len(label_names)).tolist()
    return {
        "count": len(split.labels),
        "class_counts": dict(zip(label_names, histogram, strict=True)),
        "batches": split.batch_sizes,
    }


def _file_record(path: Path, array: np.ndarray) -> dict[str, Any]:
    return {
        "sha256": file_digests(path, ("sha256",))["sha256"],
        "bytes": path.stat().st_size,
        "shape": list(array.shape),
        "dtype": str(array.dtype),
    }


class PackedDataError(ValueError):
    """A packed array is missing, cut short, not a plain array or not what manifest.json records."""


def load_packed(directory: str | os.PathLike, split: str, mmap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 32, 32, 3], labels int64 [N]) of a split, memory-mapped read-only by default.

    Each file is checked before it is mapped: its .npy header, its size against the header, and,
    where the folder has a manifest.json (the preprocess rule writes one), its shape, dtype and size
    against the manifest. Any fault is a PackedDataError naming the file.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    directory = Path(directory)
    if not directory.is_dir():
        raise PackedDataError(f"{directory}: the packed data folder does not exist")
    recorded = _manifest_files(directory)
    images, labels = (_load_array(directory / name, recorded.get(name), mmap) for name in output_names(split))
    if images.dtype != np.uint8 or images.shape[1:] != fmt.IMAGE_HWC or labels.shape != images.shape[:1]:
        raise PackedDataError(
            f"{directory}: {split} arrays do not fit together"
            f" (images {images.dtype} {images.shape}, labels {labels.shape})"
        )
    return images, labels


def _manifest_files(directory: Path) -> dict[str, dict[str, Any]]:
    """manifest.json's record of each file ({} without a manifest: arrays packed by hand)."""
    path = directory / MANIFEST
    if not path.exists():
        return {}
    try:
        files = json.loads(path.read_text())["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise PackedDataError(f"{path}: unreadable manifest ({type(error).__name__}: {error})") from None
    return files


def _load_array(path: Path, recorded: dict[str, Any] | None, mmap: bool) -> np.ndarray:
    if not path.is_file():
        raise PackedDataError(f"{path}: missing (the preprocess rule writes it)")
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = np.lib.format.read_array_header_1_0
            if version != (1, 0):
                read_header = np.lib.format.read_array_header_2_0
            shape, _, dtype = read_header(handle)
            offset = handle.tell()
    except (OSError, ValueError, EOFError, SyntaxError) as error:
        raise PackedDataError(f"{path}: not a .npy array ({error})") from None
    if dtype.hasobject:
        raise PackedDataError(f"{path}: holds pickled Python objects ({dtype}), not a packed array")
    expected = offset + math.prod(shape) * dtype.itemsize
    size = path.stat().st_size
    if size != expected:
        raise PackedDataError(
            f"{path}: {size} bytes, but its header ({dtype} {shape}) needs {expected} (cut short or damaged)"
        )
    if recorded is not None:
        found = {"shape": list(shape), "dtype": str(dtype), "bytes": size}
        differs = {key: value for key, value in found.items() if recorded.get(key) != value}
        if differs:
            wanted = {key: recorded.get(key) for key in differs}
            raise PackedDataError(f"{path}: {differs} but {path.parent / MANIFEST} records {wanted}")
    return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.data.preprocess", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--archive", type=Path, required=True, help="cifar-10-python.tar.gz (or the synthetic one)"
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="folder for the .npy arrays and manifest.json"
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    try:
        preprocess(args.archive, args.out_dir)
    except ArchiveError as error:
        print(f"preprocess: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
