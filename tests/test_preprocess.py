"""Preprocessing: exact round trip of a generated archive, strict validation, no partial outputs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from scalestudy.data import cifar_format as fmt
from scalestudy.data import preprocess
from scalestudy.data import synthetic_cifar as synthetic
from scalestudy.data.preprocess import ArchiveError

TRAIN_PER_CLASS, TEST_PER_CLASS, SEED = 10, 4, 5
OUTPUTS = {"train_images.npy", "train_labels.npy", "test_images.npy", "test_labels.npy", "manifest.json"}


@pytest.fixture(scope="module")
def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return synthetic.generate_arrays(TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)


@pytest.fixture(scope="module")
def members() -> dict[str, bytes]:
    return synthetic.archive_members(TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("archive") / "cifar-10-python.tar.gz"
    synthetic.write_archive(path, TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)
    return path


def _archive_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    fmt.write_members(buffer, members)
    return buffer.getvalue()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listing(directory: Path) -> dict[str, str]:
    return {path.name: _sha256(path) for path in directory.iterdir()} if directory.exists() else {}


def test_round_trip_reproduces_every_image_and_label(archive, arrays, tmp_path):
    out = tmp_path / "packed"
    manifest = preprocess.preprocess(archive, out)
    assert {path.name for path in out.iterdir()} == OUTPUTS
    for split, (images, labels) in {"train": arrays[:2], "test": arrays[2:]}.items():
        packed_images, packed_labels = preprocess.load_packed(out, split)
        assert isinstance(packed_images, np.memmap) and isinstance(packed_labels, np.memmap)
        assert packed_images.dtype == np.uint8 and packed_labels.dtype == np.int64
        np.testing.assert_array_equal(packed_images, images)
        np.testing.assert_array_equal(packed_labels, labels)
        in_memory, _ = preprocess.load_packed(out, split, mmap=False)
        assert not isinstance(in_memory, np.memmap)
        assert manifest["splits"][split]["count"] == len(labels)
        assert list(manifest["splits"][split]["class_counts"].values()) == np.bincount(labels).tolist()
    assert manifest["splits"]["train"]["batches"] == {name: 20 for name in fmt.TRAIN_BATCHES}


def test_manifest_records_checksums_labels_and_provenance(archive, tmp_path):
    out = tmp_path / "packed"
    preprocess.preprocess(archive, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["archive"]["sha256"] == _sha256(archive)
    assert manifest["label_names"] == list(fmt.LABEL_NAMES)
    assert manifest["splits"]["test"]["class_counts"] == dict.fromkeys(fmt.LABEL_NAMES, TEST_PER_CLASS)
    for name, record in manifest["files"].items():
        assert record["sha256"] == _sha256(out / name), name
    assert manifest["files"]["train_images.npy"]["shape"] == [10 * TRAIN_PER_CLASS, 32, 32, 3]
    assert {"git_commit", "versions", "host", "timestamp"} <= set(manifest["provenance"])


def test_running_again_replaces_outputs_cleanly(archive, tmp_path):
    out = tmp_path / "packed"
    assert preprocess.main(["--archive", str(archive), "--out-dir", str(out)]) == 0
    first = _listing(out)
    assert preprocess.main(["--archive", str(archive), "--out-dir", str(out)]) == 0
    second = _listing(out)
    assert set(second) == OUTPUTS
    assert {name: digest for name, digest in second.items() if name.endswith(".npy")} == {
        name: digest for name, digest in first.items() if name.endswith(".npy")
    }


def test_load_packed_rejects_an_unknown_split(tmp_path):
    with pytest.raises(ValueError, match="split must be one of"):
        preprocess.load_packed(tmp_path, "validation")


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(2000))


def _pickled(path: Path) -> None:
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)


def _other_valid_array(path: Path) -> None:
    np.save(path, np.zeros(3, dtype=np.int64))  # a whole .npy file, but not the one the manifest records


def _missing(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_missing, "missing"),
        (_truncate, "cut short"),
        (_garbage, "not a .npy array"),
        (_pickled, "pickled Python objects"),
        (_other_valid_array, "manifest.json records"),
    ],
)
@pytest.mark.parametrize("name", ["test_labels.npy", "test_images.npy"])
def test_damaged_packed_arrays_are_named_before_they_are_mapped(archive, tmp_path, damage, message, name):
    out = tmp_path / "packed"
    preprocess.preprocess(archive, out)
    damage(out / name)
    for mmap in (True, False):
        with pytest.raises(preprocess.PackedDataError, match=message) as error:
            preprocess.load_packed(out, "test", mmap=mmap)
        assert str(out / name) in str(error.value) and "\n" not in str(error.value)
    preprocess.load_packed(out, "train")  # the other split is intact


def test_packed_arrays_without_a_manifest_are_checked_by_their_headers(archive, tmp_path):
    out = tmp_path / "packed"
    preprocess.preprocess(archive, out)
    (out / "manifest.json").unlink()
    assert len(preprocess.load_packed(out, "test")[1]) == 10 * TEST_PER_CLASS
    _truncate(out / "test_images.npy")
    with pytest.raises(preprocess.PackedDataError, match="test_images.npy.*cut short"):
        preprocess.load_packed(out, "test")


def test_a_missing_folder_or_a_garbled_manifest_is_named(archive, tmp_path):
    with pytest.raises(preprocess.PackedDataError, match="does not exist"):
        preprocess.load_packed(tmp_path / "nowhere", "train")
    out = tmp_path / "packed"
    preprocess.preprocess(archive, out)
    (out / "manifest.json").write_text("{not json")
    with pytest.raises(preprocess.PackedDataError, match="manifest.json: unreadable manifest"):
        preprocess.load_packed(out, "train")


# ---------------------------------------------------------------------------------------------
# Corruption: each kind gives its own clear error and leaves nothing behind.


def _batch(data: np.ndarray, labels: list[int]) -> bytes:
    return fmt.dump_py2_pickle({"batch_label": "broken batch", "labels": labels, "data": data})


def _good_batch(members: dict[str, bytes], name: str) -> tuple[np.ndarray, list[int]]:
    entry = fmt.load_pickle(members[name])
    return entry["data"], entry["labels"]


class _CallsGetcwd:
    def __reduce__(self):
        return (os.getcwd, ())


def _replace(name: str, make: Callable[[np.ndarray, list[int]], bytes]) -> Callable[[dict], dict]:
    def change(members: dict[str, bytes]) -> dict[str, bytes]:
        return {**members, name: make(*_good_batch(members, name))}

    return change


MEMBER_DAMAGE = {
    "missing member": (
        lambda m: {name: payload for name, payload in m.items() if name != "data_batch_3"},
        ["missing member", "cifar-10-batches-py/data_batch_3"],
    ),
    "truncated pickle": (
        lambda m: {**m, "data_batch_2": m["data_batch_2"][: len(m["data_batch_2"]) // 2]},
        ["member cifar-10-batches-py/data_batch_2", "not a valid pickle (truncated or corrupt)"],
    ),
    "not a pickle": (
        lambda m: {**m, "test_batch": b"<html>not found</html>"},
        ["member cifar-10-batches-py/test_batch", "not a valid pickle"],
    ),
    "foreign global": (
        lambda m: {**m, "data_batch_4": __import__("pickle").dumps({"data": _CallsGetcwd()}, protocol=2)},
        [
            "member cifar-10-batches-py/data_batch_4",
            f"refused to unpickle: refers to {os.getcwd.__module__}.getcwd",
        ],
    ),
    "not a dict": (
        lambda m: {**m, "data_batch_1": fmt.dump_py2_pickle([1, 2, 3])},
        ["member cifar-10-batches-py/data_batch_1", "expected a pickled dict, found list"],
    ),
    "no data entry": (
        lambda m: {**m, "data_batch_5": fmt.dump_py2_pickle({"labels": [1]})},
        ["member cifar-10-batches-py/data_batch_5", "no 'data' entry"],
    ),
    "data not uint8": (
        _replace("data_batch_1", lambda data, labels: _batch(data.astype(np.float32), labels)),
        ["member cifar-10-batches-py/data_batch_1", "'data' has dtype float32, expected uint8"],
    ),
    "data wrong shape": (
        _replace("test_batch", lambda data, labels: _batch(data[:, :3071], labels)),
        ["member cifar-10-batches-py/test_batch", "'data' has shape (40, 3071), expected (N, 3072)"],
    ),
    "labels length mismatch": (
        _replace("data_batch_2", lambda data, labels: _batch(data, labels[:-1])),
        ["member cifar-10-batches-py/data_batch_2", "19 labels for 20 images"],
    ),
    "label too large": (
        _replace("data_batch_3", lambda data, labels: _batch(data, [*labels[:5], 10, *labels[6:]])),
        ["member cifar-10-batches-py/data_batch_3", "label 10 at index 5 is outside 0..9"],
    ),
    "label negative": (
        _replace("test_batch", lambda data, labels: _batch(data, [-1, *labels[1:]])),
        ["member cifar-10-batches-py/test_batch", "label -1 at index 0 is outside 0..9"],
    ),
    "labels not integers": (
        _replace("data_batch_1", lambda data, labels: _batch(data, ["cat"] * len(labels))),
        ["member cifar-10-batches-py/data_batch_1", "'labels' must be a flat sequence of integers"],
    ),
    "meta with nine names": (
        lambda m: {**m, "batches.meta": fmt.dump_py2_pickle({"label_names": list(fmt.LABEL_NAMES[:9])})},
        ["member cifar-10-batches-py/batches.meta", "expected 10 distinct label names"],
    ),
}

ARCHIVE_DAMAGE = {
    "gzip trailer cut off": (lambda raw: raw[:-4], ["not a readable .tar.gz (truncated or corrupt)"]),
    "truncated half-way": (
        lambda raw: raw[: len(raw) // 2],
        ["not a readable .tar.gz (truncated or corrupt)"],
    ),
    "flipped byte": (
        lambda raw: raw[:5000] + bytes([raw[5000] ^ 0xFF]) + raw[5001:],
        ["not a readable .tar.gz (truncated or corrupt)"],
    ),
    "not gzip": (lambda raw: b"<html>404 Not Found</html>", ["not a readable .tar.gz"]),
}


def _assert_fails_cleanly(archive: Path, out: Path, fragments: list[str]) -> None:
    before = _listing(out)
    with pytest.raises(ArchiveError) as caught:
        preprocess.preprocess(archive, out)
    message = str(caught.value)
    assert str(archive) in message
    for fragment in fragments:
        assert fragment in message
    assert _listing(out) == before  # nothing new, nothing half-written, nothing removed


@pytest.mark.parametrize("damage", MEMBER_DAMAGE, ids=list(MEMBER_DAMAGE))
def test_damaged_member_is_named_and_leaves_no_output(members, tmp_path, damage):
    change, fragments = MEMBER_DAMAGE[damage]
    archive = tmp_path / "cifar-10-python.tar.gz"
    archive.write_bytes(_archive_bytes(change(dict(members))))
    out = tmp_path / "existing-output-dir"
    out.mkdir()
    (out / "unrelated.txt").write_text("kept")
    _assert_fails_cleanly(archive, out, fragments)


@pytest.mark.parametrize("damage", ARCHIVE_DAMAGE, ids=list(ARCHIVE_DAMAGE))
def test_damaged_archive_is_reported_and_leaves_no_output(archive, tmp_path, damage):
    change, fragments = ARCHIVE_DAMAGE[damage]
    damaged = tmp_path / "cifar-10-python.tar.gz"
    damaged.write_bytes(change(archive.read_bytes()))
    out = tmp_path / "new-output-dir"
    _assert_fails_cleanly(damaged, out, fragments)
    assert not out.exists()


def test_missing_archive_is_reported(tmp_path):
    _assert_fails_cleanly(tmp_path / "absent.tar.gz", tmp_path / "out", ["no such file"])


def test_failed_write_keeps_the_previous_outputs(archive, tmp_path, monkeypatch):
    out = tmp_path / "packed"
    preprocess.preprocess(archive, out)
    before = _listing(out)
    real_save, saved = np.save, []

    def save_then_fail(path, array):
        if len(saved) == 2:
            raise OSError("disk full")
        saved.append(path)
        real_save(path, array)

    monkeypatch.setattr(preprocess.np, "save", save_then_fail)
    with pytest.raises(OSError, match="disk full"):
        preprocess.preprocess(archive, out)
    assert _listing(out) == before


def test_command_line_error_is_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"garbage")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalestudy.data.preprocess",
            "--archive",
            str(bad),
            "--out-dir",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("preprocess: error: ") and str(bad) in lines[-1]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "o").exists()
