"""The synthetic archive: genuine CIFAR-10 format (both pickle encodings, torchvision), determinism,
and class structure that is learnable but not trivial."""

from __future__ import annotations

import hashlib
import pickle
import pickletools
import tarfile
from pathlib import Path

import numpy as np
import pytest

from scalestudy.data import cifar_format as fmt
from scalestudy.data import synthetic_cifar as synthetic

TRAIN_PER_CLASS, TEST_PER_CLASS, SEED = 10, 4, 7
BATCH_NAMES = (*fmt.TRAIN_BATCHES, fmt.TEST_BATCH, fmt.META)


@pytest.fixture(scope="module")
def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return synthetic.generate_arrays(TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("archive") / "cifar-10-python.tar.gz"
    synthetic.write_archive(path, TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)
    return path


@pytest.fixture(scope="module")
def extracted(archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("extracted")
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(extracted: Path, name: str, encoding: str) -> dict:
    with open(extracted / fmt.member_path(name), "rb") as handle:
        return pickle.load(handle, encoding=encoding)


def test_arrays_have_cifar_shapes_dtypes_and_balanced_classes(arrays):
    train_images, train_labels, test_images, test_labels = arrays
    for images, labels, per_class in (
        (train_images, train_labels, TRAIN_PER_CLASS),
        (test_images, test_labels, TEST_PER_CLASS),
    ):
        assert images.shape == (10 * per_class, 32, 32, 3) and images.dtype == np.uint8
        assert labels.shape == (10 * per_class,) and labels.dtype == np.int64
        assert np.bincount(labels, minlength=10).tolist() == [per_class] * 10
    assert train_images.std() > 0 and train_images.min() < 30 and train_images.max() > 225


def test_arrays_depend_only_on_the_seed(arrays):
    again = synthetic.generate_arrays(TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)
    other = synthetic.generate_arrays(TRAIN_PER_CLASS, TEST_PER_CLASS, SEED + 1)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, again, strict=True))
    assert not np.array_equal(arrays[0], other[0])


def test_archive_has_the_official_layout(archive):
    with tarfile.open(archive) as tar:
        members = {info.name: info for info in tar.getmembers()}
    expected = {fmt.BATCH_FOLDER, *(fmt.member_path(name) for name in (*BATCH_NAMES, fmt.README))}
    assert set(members) == expected
    assert members[fmt.BATCH_FOLDER].isdir()
    assert all(info.uid == 0 and info.mtime == fmt.ARCHIVE_MTIME for info in members.values())


@pytest.mark.parametrize("encoding", ["latin1", "bytes"])
def test_batches_load_with_either_pickle_encoding(extracted, arrays, encoding):
    key = (lambda name: name.encode()) if encoding == "bytes" else (lambda name: name)
    text_type = bytes if encoding == "bytes" else str
    train_images, train_labels, test_images, test_labels = arrays
    batches = [_load(extracted, name, encoding) for name in fmt.TRAIN_BATCHES]
    assert [len(batch[key("labels")]) for batch in batches] == [len(train_labels) // 5] * 5
    assert all(isinstance(name, text_type) for batch in batches for name in batch)
    assert isinstance(batches[0][key("batch_label")], text_type)
    rows = np.concatenate([batch[key("data")] for batch in batches])
    assert rows.dtype == np.uint8 and rows.shape == (len(train_labels), 3072)
    np.testing.assert_array_equal(rows, fmt.images_to_rows(train_images))
    assert sum((batch[key("labels")] for batch in batches), []) == train_labels.tolist()

    test = _load(extracted, fmt.TEST_BATCH, encoding)
    np.testing.assert_array_equal(test[key("data")], fmt.images_to_rows(test_images))
    assert test[key("labels")] == test_labels.tolist()
    meta = _load(extracted, fmt.META, encoding)
    assert meta[key("label_names")] == [key(name) for name in fmt.LABEL_NAMES]
    assert meta[key("num_vis")] == 3072 and meta[key("num_cases_per_batch")] == len(train_labels) // 5


def test_row_layout_is_red_green_blue_planes(arrays):
    images = arrays[0][:3]
    rows = fmt.images_to_rows(images)
    assert rows[1, 0] == images[1, 0, 0, 0] and rows[1, 1] == images[1, 0, 1, 0]  # red plane, row-major
    assert rows[1, 32] == images[1, 1, 0, 0]
    assert rows[1, 1024] == images[1, 0, 0, 1] and rows[1, 2048 + 33] == images[1, 1, 1, 2]
    np.testing.assert_array_equal(fmt.rows_to_images(rows), images)


@pytest.mark.parametrize("name", BATCH_NAMES)
def test_strings_are_python2_str_opcodes(extracted, name):
    """Python 2 wrote str as (SHORT_)BINSTRING; a Python 3 pickle would show (SHORT_)BINUNICODE."""
    payload = (extracted / fmt.member_path(name)).read_bytes()
    assert payload.startswith(b"\x80\x02")
    opcodes = {opcode.name for opcode, _, _ in pickletools.genops(payload)}
    assert "SHORT_BINSTRING" in opcodes
    assert not opcodes & {"BINUNICODE", "SHORT_BINUNICODE", "BINBYTES", "SHORT_BINBYTES"}


def test_torchvision_reads_the_archive(extracted, arrays, monkeypatch):
    cifar = pytest.importorskip("torchvision.datasets.cifar")
    # The md5 sums of the official batch files cannot match synthetic ones; everything else is real.
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: True)
    train_images, train_labels, test_images, test_labels = arrays
    train = cifar.CIFAR10(str(extracted), train=True, download=False)
    test = cifar.CIFAR10(str(extracted), train=False, download=False)
    np.testing.assert_array_equal(train.data, train_images)
    np.testing.assert_array_equal(test.data, test_images)
    assert train.targets == train_labels.tolist() and test.targets == test_labels.tolist()
    assert train.classes == list(fmt.LABEL_NAMES)
    image, label = train[3]
    assert image.size == (32, 32) and label == train_labels[3]


def test_archive_bytes_depend_only_on_the_seed(archive, tmp_path):
    again = synthetic.write_archive(tmp_path / "again.tar.gz", TRAIN_PER_CLASS, TEST_PER_CLASS, SEED)
    other = synthetic.write_archive(tmp_path / "other.tar.gz", TRAIN_PER_CLASS, TEST_PER_CLASS, SEED + 1)
    assert again == _sha256(archive) == _sha256(tmp_path / "again.tar.gz")
    assert other != again
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "again.tar.gz",
        "other.tar.gz",
    ]  # no temp files


def test_classes_are_learnable_but_not_trivial():
    """A linear classifier on 8x8 pooled pixels beats chance (0.1) by far, yet stays far from perfect.

    (Measured: about 0.3 for seeds 0-4; a small CNN reaches about 0.8 after a few epochs.)"""
    train_images, train_labels, test_images, test_labels = synthetic.generate_arrays(150, 60, seed=3)

    def features(images: np.ndarray) -> np.ndarray:
        pooled = images.reshape(len(images), 8, 4, 8, 4, 3).mean(axis=(2, 4)) / 255.0  # 8x8 pixels
        return np.concatenate([pooled.reshape(len(images), -1), np.ones((len(images), 1))], axis=1)

    train_x, test_x = features(train_images), features(test_images)
    targets = np.eye(10)[train_labels]
    weights = np.linalg.solve(train_x.T @ train_x + 1.0 * np.eye(train_x.shape[1]), train_x.T @ targets)
    accuracy = float(np.mean((test_x @ weights).argmax(axis=1) == test_labels))
    assert 0.2 < accuracy < 0.6, accuracy


def test_writing_rejects_empty_classes(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        synthetic.write_archive(tmp_path / "x.tar.gz", 0, 1, SEED)
    assert not list(tmp_path.iterdir())
