"""Data preparation: fetch (or synthesise) the CIFAR-10 archive, then pack it for the trainer.

Submodules: `synthetic` (a deterministic stand-in archive), `fetch` (mirrors, resumable HTTP,
checksums), `preprocess` (archive -> memory-mappable .npy arrays + manifest), `cifar_format`
(the archive's Python-2 pickle batch format).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

_READ_CHUNK = 1 << 20


def file_digests(path: str | os.PathLike, algorithms: Iterable[str] = ("md5", "sha256")) -> dict[str, str]:
    """Hex digests of a file's content, all algorithms in one pass: {"md5": ..., "sha256": ...}."""
    hashers = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            for hasher in hashers.values():
                hasher.update(chunk)
    return {name: hasher.hexdigest() for name, hasher in hashers.items()}
