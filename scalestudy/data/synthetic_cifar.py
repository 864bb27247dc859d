"""A deterministic stand-in for CIFAR-10: learnable classes, written in the genuine archive format.

Each image shows one textured "object" (a soft disc) at a random place and size on a random
colour-gradient background. The class decides the object's texture (horizontal or vertical stripes,
rings or a checker pattern), its stripe frequency and its two colours; classes share each of these
cues with others, so no single cue separates them. Random contrast, brightness, pixel noise and
mirror flips make some images genuinely ambiguous: a small CNN learns the classes quickly, but not
perfectly.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from scalestudy.atomic import atomic_path
from scalestudy.data import cifar_format as fmt
from scalestudy.data import file_digests
from scalestudy.progress import Progress

log = logging.getLogger("scalestudy.data.synthetic")

SIDE = fmt.IMAGE_HWC[0]
CHUNK = 1024  # images rendered at once; part of the definition of the output for a seed

# Colour pairs (first, second stripe colour) in RGB 0..1; class c uses pair c % 5.
_COLOUR_PAIRS = np.array(
    [
        [[0.85, 0.15, 0.10], [0.95, 0.85, 0.20]],  # red / yellow
        [[0.10, 0.25, 0.85], [0.90, 0.90, 0.95]],  # blue / white
        [[0.10, 0.60, 0.15], [0.05, 0.05, 0.05]],  # green / black
        [[0.80, 0.20, 0.75], [0.20, 0.80, 0.85]],  # magenta / cyan
        [[0.95, 0.55, 0.10], [0.10, 0.10, 0.40]],  # orange / navy
    ],
    dtype=np.float32,
)
_TEXTURE_KINDS = 4  # class c uses texture c % 4: see _texture
_CYCLES_PER_IMAGE = np.array([3.0, 3.0, 3.0, 3.0, 4.0, 4.0, 4.0, 4.0, 5.0, 5.0], dtype=np.float32)


def generate_arrays(
    train_per_class: int, test_per_class: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_images, train_labels, test_images, test_labels): uint8 [N, 32, 32, 3], int64 [N].

    The same seed gives the same arrays; the two splits come from independent random streams.
    """
    train_stream, test_stream = np.random.SeedSequence(seed).spawn(2)
    train_images, train_labels = _generate_split(
        "train", train_per_class, np.random.default_rng(train_stream)
    )
    test_images, test_labels = _generate_split("test", test_per_class, np.random.default_rng(test_stream))
    return train_images, train_labels, test_images, test_labels


def _generate_split(split: str, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if per_class < 1:
        raise ValueError(f"{split} images per class must be at least 1, got {per_class}")
    labels = rng.permutation(np.repeat(np.arange(fmt.NUM_CLASSES, dtype=np.int64), per_class))
    images = np.empty((len(labels), *fmt.IMAGE_HWC), dtype=np.uint8)
    progress = Progress(f"generate synthetic {split} images", len(labels), unit="images", logger=log)
    for start in range(0, len(labels), CHUNK):
        images[start : start + CHUNK] = _render(labels[start : start + CHUNK], rng)
        progress.advance(min(CHUNK, len(labels) - start))
    return images, labels


def _render(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """uint8 HWC images for `labels`; computed channel-first, where numpy's inner loops are long."""
    count = len(labels)
    y, x = _pixel_grid(count, rng)
    centre_x, centre_y = rng.uniform(9, SIDE - 9, (2, count, 1, 1)).astype(np.float32)
    radius = rng.uniform(7, 13, (count, 1, 1)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, (count, 1, 1)).astype(np.float32)
    contrast = rng.uniform(0.0, 1.0, (count, 1, 1)).astype(np.float32)  # near 0: lost in the noise
    brightness = rng.uniform(0.7, 1.3, (count, 1, 1, 1)).astype(np.float32)
    dx, dy = x - centre_x, y - centre_y

    # Object opacity: a disc with a soft 2-pixel edge, scaled by the image's contrast.
    alpha = (np.clip(radius - np.sqrt(dx * dx + dy * dy), 0, 2.0) * (contrast / 2.0))[:, None]
    first, second = _COLOUR_PAIRS[labels % len(_COLOUR_PAIRS)].transpose(1, 0, 2)[..., None, None]
    image = _background(count, y, x, rng)
    image += alpha * (first + (second - first) * _texture(labels, dx, dy, phase)[:, None] - image)
    image *= brightness * 255
    image += _gaussian_noise(image.shape, 0.10 * 255, rng)
    image += 0.5
    return np.clip(image, 0, 255, out=image).astype(np.uint8).transpose(0, 2, 3, 1)


def _pixel_grid(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Row and column coordinates, (1, 32, 1) and (count, 1, 32); half the images mirrored."""
    grid = np.arange(SIDE, dtype=np.float32)
    mirrored = rng.random(count) < 0.5
    x = np.where(mirrored[:, None], grid[::-1], grid)[:, None, :]
    return grid[None, :, None], x


def _background(count: int, y: np.ndarray, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A linear gradient between two random colours in a random direction: (count, 3, 32, 32)."""
    start, end = rng.uniform(0, 1, (2, count, 3, 1, 1)).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi, (count, 1, 1)).astype(np.float32)
    ramp = (x - SIDE / 2) * (np.cos(angle) / SIDE) + (y - SIDE / 2) * (np.sin(angle) / SIDE) + 0.5
    return start + (end - start) * np.clip(ramp, 0, 1)[:, None]


# Standard normal quantiles at 4096 evenly spaced probabilities: indexing this table with random
# integers gives Gaussian noise several times faster than Generator.standard_normal.
_NORMAL_TABLE = np.asarray([NormalDist().inv_cdf((i + 0.5) / 4096) for i in range(4096)], dtype=np.float32)


def _gaussian_noise(shape: tuple[int, ...], sigma: float, rng: np.random.Generator) -> np.ndarray:
    indices = rng.integers(0, len(_NORMAL_TABLE), shape, dtype=np.uint16)
    return _NORMAL_TABLE[indices] * np.float32(sigma)


def _texture(labels: np.ndarray, dx: np.ndarray, dy: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """Per image, the class's texture around the object centre, in 0..1."""
    textures: dict[int, Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]] = {
        0: lambda u, v, p: np.sin(v + p),  # horizontal stripes
        1: lambda u, v, p: np.sin(u + p),  # vertical stripes
        2: lambda u, v, p: np.sin(np.sqrt(u * u + v * v) + p),  # rings
        3: lambda u, v, p: 1.5 * np.sin(u + p) * np.sin(v + p),  # checker
    }
    angular = (2 * np.pi / SIDE) * _CYCLES_PER_IMAGE[labels][:, None, None]  # radians per pixel
    u, v = angular * dx, angular * dy
    out = np.empty((len(labels), SIDE, SIDE), dtype=np.float32)
    kind = labels % _TEXTURE_KINDS
    for index, texture in textures.items():
        chosen = kind == index
        out[chosen] = 0.5 + 0.5 * np.clip(texture(u[chosen], v[chosen], phase[chosen]), -1, 1)
    return out


def archive_members(train_per_class: int, test_per_class: int, seed: int) -> dict[str, bytes]:
    """The archive's files (name -> bytes): batches.meta, data_batch_1..5, readme.html, test_batch."""
    train_images, train_labels, test_images, test_labels = generate_arrays(
        train_per_class, test_per_class, seed
    )
    train_parts = np.array_split(np.arange(len(train_labels)), len(fmt.TRAIN_BATCHES))
    members = {
        fmt.META: fmt.dump_py2_pickle(
            {
                "num_cases_per_batch": len(train_parts[0]),
                "label_names": list(fmt.LABEL_NAMES),
                "num_vis": 3072,
            }
        )
    }
    for number, (name, part) in enumerate(zip(fmt.TRAIN_BATCHES, train_parts, strict=True), start=1):
        label = f"training batch {number} of {len(fmt.TRAIN_BATCHES)}"
        members[name] = _batch_pickle(label, train_images[part], train_labels[part], first_index=part[0])
    members[fmt.README] = _readme(train_per_class, test_per_class, seed).encode()
    members[fmt.TEST_BATCH] = _batch_pickle("testing batch 1 of 1", test_images, test_labels, first_index=0)
    return members


def _batch_pickle(batch_label: str, images: np.ndarray, labels: np.ndarray, first_index: int) -> bytes:
    filenames = [
        f"synthetic_{fmt.LABEL_NAMES[label]}_s_{first_index + offset:06d}.png"
        for offset, label in enumerate(labels)
    ]
    return fmt.dump_py2_pickle(
        {
            "batch_label": batch_label,
            "labels": [int(label) for label in labels],
            "data": fmt.images_to_rows(images),
            "filenames": filenames,
        }
    )


def _readme(train_per_class: int, test_per_class: int, seed: int) -> str:
    return (
        "<html><body><h1>Synthetic CIFAR-10 stand-in</h1>\n"
        f"<p>Generated by scalestudy.data.synthetic_cifar with seed {seed}: {train_per_class} training and "
        f"{test_per_class} test images per class, in the format of the CIFAR-10 python version.</p>\n"
        "</body></html>\n"
    )


def write_archive(path: str | os.PathLike, train_per_class: int, test_per_class: int, seed: int) -> str:
    """Write cifar-10-python.tar.gz-format data to `path` atomically; return its sha256.

    The bytes depend only on the arguments (and the zlib version), so the checksum is stable.
    """
    members = archive_members(train_per_class, test_per_class, seed)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            fmt.write_members(handle, members)
        digest = file_digests(tmp, ("sha256",))["sha256"]
    log.info(
        "synthetic archive: seed %d, %d/%d images per class, sha256 %s",
        seed,
        train_per_class,
        test_per_class,
        digest,
    )
    return digest
