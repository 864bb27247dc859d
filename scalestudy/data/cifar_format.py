"""The CIFAR-10 "python version" archive format, shared by the synthetic writer and the preprocessor.

The official batches are Python-2 pickles (protocol 2). Their dict keys and strings are Python-2
`str`, which Python 3 loads as `str` with `encoding="latin1"` (torchvision) and as `bytes` with
`encoding="bytes"`. Python 3's pickler cannot produce that (it writes `str` as unicode and `bytes`
through a `_codecs.encode` call), so `dump_py2_pickle` writes the opcodes itself, exactly as
Python 2's cPickle did for these objects.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import tarfile
from collections.abc import Mapping
from typing import Any, BinaryIO

import numpy as np

BATCH_FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{index}" for index in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
README = "readme.html"
LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
NUM_CLASSES = len(LABEL_NAMES)
IMAGE_HWC = (32, 32, 3)
ROW_LENGTH = 32 * 32 * 3

# Fixed metadata so that the same members always give the same archive bytes (2009-01-01, the
# year CIFAR-10 was published; a zero mtime makes some tools complain about 1970 files).
ARCHIVE_MTIME = 1_230_768_000
GZIP_LEVEL = 6

# Globals a CIFAR batch may name: numpy's array reconstruction under its old (Python 2, numpy 1)
# and new module paths. Anything else in an archive is refused instead of being executed.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


def member_path(name: str) -> str:
    """The archive member name of one batch file, e.g. 'cifar-10-batches-py/data_batch_1'."""
    return f"{BATCH_FOLDER}/{name}"


def images_to_rows(images: np.ndarray) -> np.ndarray:
    """uint8 [N, 32, 32, 3] (HWC) -> uint8 [N, 3072] in CIFAR order (R, G, B planes, row-major)."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2)).reshape(len(images), ROW_LENGTH)


def rows_to_images(rows: np.ndarray) -> np.ndarray:
    """The inverse of `images_to_rows`."""
    return np.ascontiguousarray(rows.reshape(len(rows), 3, 32, 32).transpose(0, 2, 3, 1))


# ---------------------------------------------------------------------------------------------
# Writing: Python-2 cPickle protocol 2 opcodes.


def dump_py2_pickle(obj: Any) -> bytes:
    """Pickle `obj` (dict, list, tuple, str/bytes, int, bool, None, numeric ndarray) as Python 2 did."""
    parts: list[bytes] = [pickle.PROTO + b"\x02"]
    _emit(obj, parts)
    parts.append(pickle.STOP)
    return b"".join(parts)


def _emit(obj: Any, parts: list[bytes]) -> None:
    if isinstance(obj, np.ndarray):
        _emit_ndarray(obj, parts)
    elif isinstance(obj, Mapping):
        _emit_container(pickle.EMPTY_DICT, pickle.SETITEMS, [x for item in obj.items() for x in item], parts)
    elif isinstance(obj, list):
        _emit_container(pickle.EMPTY_LIST, pickle.APPENDS, obj, parts)
    elif isinstance(obj, tuple):
        _emit_tuple(obj, parts)
    elif obj is None:
        parts.append(pickle.NONE)
    elif isinstance(obj, bool):
        parts.append(pickle.NEWTRUE if obj else pickle.NEWFALSE)
    elif isinstance(obj, int | np.integer):
        parts.append(_int_opcode(int(obj)))
    elif isinstance(obj, str | bytes):
        parts.append(_py2_str_opcode(obj.encode("latin1") if isinstance(obj, str) else obj))
    else:
        raise TypeError(f"cannot write {type(obj).__name__} as a Python-2 pickle")


def _emit_container(empty: bytes, add_items: bytes, items: list[Any], parts: list[bytes]) -> None:
    parts.append(empty)
    if items:
        parts.append(pickle.MARK)
        for item in items:
            _emit(item, parts)
        parts.append(add_items)


def _emit_tuple(items: tuple[Any, ...], parts: list[bytes]) -> None:
    short_forms = {0: pickle.EMPTY_TUPLE, 1: pickle.TUPLE1, 2: pickle.TUPLE2, 3: pickle.TUPLE3}
    if len(items) not in short_forms:
        parts.append(pickle.MARK)
    for item in items:
        _emit(item, parts)
    parts.append(short_forms.get(len(items), pickle.TUPLE))


def _int_opcode(value: int) -> bytes:
    if 0 <= value < 1 << 8:
        return pickle.BININT1 + struct.pack("<B", value)
    if 0 <= value < 1 << 16:
        return pickle.BININT2 + struct.pack("<H", value)
    if -(1 << 31) <= value < 1 << 31:
        return pickle.BININT + struct.pack("<i", value)
    raise ValueError(f"integer {value} does not fit a 32-bit pickle opcode")


def _py2_str_opcode(data: bytes) -> bytes:
    """A Python-2 `str`: SHORT_BINSTRING / BINSTRING (bytes under encoding='bytes', str under latin1)."""
    if len(data) < 1 << 8:
        return pickle.SHORT_BINSTRING + struct.pack("<B", len(data)) + data
    return pickle.BINSTRING + struct.pack("<i", len(data)) + data


def _global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii")


def _emit_ndarray(array: np.ndarray, parts: list[bytes]) -> None:
    """numpy 1.x on Python 2: _reconstruct(ndarray, (0,), 'b') then BUILD with the array state."""
    if array.dtype.fields is not None or array.dtype.hasobject:
        raise TypeError(f"only plain numeric arrays can be written, not dtype {array.dtype}")
    parts.append(_global("numpy.core.multiarray", "_reconstruct") + _global("numpy", "ndarray"))
    _emit_tuple((0,), parts)
    parts.append(_py2_str_opcode(b"b") + pickle.TUPLE3 + pickle.REDUCE)
    parts.append(pickle.MARK)  # array state: (version, shape, dtype, is_fortran, raw data)
    _emit(1, parts)
    _emit(tuple(array.shape), parts)
    _emit_dtype(array.dtype, parts)
    parts.append(pickle.NEWFALSE)  # not Fortran order
    parts.append(_py2_str_opcode(np.ascontiguousarray(array).tobytes()))
    parts.append(pickle.TUPLE + pickle.BUILD)


def _emit_dtype(dtype: np.dtype, parts: list[bytes]) -> None:
    byte_order, code = dtype.str[0], dtype.str[1:]
    parts.append(_global("numpy", "dtype"))
    _emit((code, 0, 1), parts)
    parts.append(pickle.REDUCE)
    # dtype state, version 3: (version, byte order, subarray, names, fields, elsize, alignment, flags)
    _emit((3, byte_order, None, None, None, -1, -1, 0), parts)
    parts.append(pickle.BUILD)


def write_members(handle: BinaryIO, members: Mapping[str, bytes]) -> None:
    """Write a .tar.gz of `members` (name -> content) whose bytes depend only on the members.

    Every name is put under BATCH_FOLDER, after a folder entry, in the given order.
    """
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0, compresslevel=GZIP_LEVEL) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.USTAR_FORMAT) as tar,
    ):
        tar.addfile(_tar_info(BATCH_FOLDER, tarfile.DIRTYPE, 0o755))
        for name, content in members.items():
            info = _tar_info(member_path(name), tarfile.REGTYPE, 0o644, size=len(content))
            tar.addfile(info, io.BytesIO(content))


def _tar_info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, ARCHIVE_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# ---------------------------------------------------------------------------------------------
# Reading.


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle would call something other than numpy's array reconstruction."""


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise ForbiddenGlobal(f"refers to {module}.{name}, which a CIFAR batch never needs")
        return super().find_class(module, name)


def load_pickle(payload: bytes) -> Any:
    """Unpickle a batch file like torchvision does (latin1), refusing anything but numpy globals.

    Raises ForbiddenGlobal for any other global, and pickle.UnpicklingError (or EOFError,
    ValueError, ...) on a corrupt or truncated pickle.
    """
    return _BatchUnpickler(io.BytesIO(payload), encoding="latin1").load()


def text_keys(entry: dict[Any, Any]) -> dict[Any, Any]:
    """Keys as str, also for batches written by Python 3 with bytes keys."""
    return {key.decode("latin1") if isinstance(key, bytes) else key: value for key, value in entry.items()}
