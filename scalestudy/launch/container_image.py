"""The container image's sha256, computed once per image by a rule, read by every job.

    python -m scalestudy.launch.container_image --image IMAGE.sif --out results/image/IMAGE.sif.sha256.json

Hashing a multi-GB .sif takes seconds to minutes, so no job and no Snakefile parse hashes it: rule
image_digest (rules/container.smk) writes `results/image/<image name>.sha256.json` (image path, size,
mtime and sha256) after build_image, or once for a prebuilt image, and every containerized job
depends on that file. The Snakefile exports its path as SCALESTUDY_IMAGE_DIGEST (and through
APPTAINERENV_*, into the image); `scalestudy.launch.launcher` and `scalestudy.provenance` read the sha256 from
it (`recorded_sha256`). A digest whose size or mtime no longer match the image is not used: it says
"stale" rather than naming a sha256 the image no longer has. Pure standard library.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from scalestudy import atomic, contract

DIGEST_DIR = "results/image"
DIGEST_ENV = "SCALESTUDY_IMAGE_DIGEST"
# The image a job runs in and its sha256, set by the launcher for its ranks; scalestudy.provenance reads them.
IMAGE_ENV = "SCALESTUDY_IMAGE"
IMAGE_SHA256_ENV = "SCALESTUDY_IMAGE_SHA256"
CHUNK = 1 << 24


def digest_path(image: str) -> str:
    """Where rule image_digest writes the digest of `image`."""
    return f"{DIGEST_DIR}/{os.path.basename(image)}.sha256.json"


def stamp(image: str | os.PathLike) -> dict[str, int]:
    info = os.stat(image)
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def compute(image: str | os.PathLike) -> dict[str, Any]:
    """The digest record of an image: its absolute path, size, mtime and sha256."""
    before = stamp(image)
    digest = hashlib.sha256()
    with open(image, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    if stamp(image) != before:
        raise RuntimeError(f"{image} changed while it was being hashed (a build still writing it?)")
    return {"image": os.path.abspath(image), **before, "sha256": digest.hexdigest()}


def recorded_sha256(image: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The sha256 in the image's digest file, "stale (...)" if the image changed since, or None
    without a digest file. Never hashes."""
    environ = os.environ if environ is None else environ
    path = environ.get(DIGEST_ENV) or digest_path(image)
    try:
        record = json.loads(Path(path).read_text())
        sha256 = record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        current = stamp(image)
    except OSError:
        return sha256  # the image is not visible here (inside it, say): trust the rule's record
    if any(record.get(key) != value for key, value in current.items()):
        return f"stale ({path} is older than {image}; rerun rule image_digest)"
    return sha256


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.launch.container_image", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--image", required=True, help="the .sif")
    parser.add_argument("--out", required=True, type=Path, help="the digest file (JSON)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.image):
        print(f"imagedigest: error: image {args.image!r} does not exist", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    record = compute(args.image)
    atomic.write_json(args.out, record)
    print(f"imagedigest: {args.image}: sha256 {record['sha256']} ({record['size']} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
