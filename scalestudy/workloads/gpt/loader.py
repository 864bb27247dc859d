"""The LM's batches: (input, next-token target) sequences from the packed uint16 token arrays.

A split of N tokens holds N // (seq_len + 1) non-overlapping windows of seq_len + 1 tokens; window
i gives x = tokens[i * (seq_len + 1) : ... + seq_len] and y = the same shifted by one.

The data order is defined by a GLOBAL sample index, not by the rank count. Training: epoch e's
order is a permutation of all windows from a torch.Generator seeded with seed * 1000003 + e; step
s's global batch is order[s * G : (s + 1) * G] with G = batch_size * world_size, and rank r takes
the slice [r * batch_size : (r + 1) * batch_size] of it. So 2 ranks x 8 and 1 rank x 16 train on
exactly the same global batch at every step, and a checkpoint taken at step s resumes at another
world size (same global batch) with the same data. The windows left over after the last full
global batch are skipped that epoch (another order next epoch).

Evaluation: no shuffle; rank r takes windows r, r + W, ... in batches of batch_size. Every rank
runs the same number of batches (FSDP's forward is a collective): a rank's last batches may be
short or even empty, and over all ranks every window is evaluated exactly once (unless max_steps
cuts it short), so per-rank loss sums and token counts all-reduce to the exact split mean.

One host-to-device copy per batch ([B, seq_len + 1] int64, through
scalestudy.workloads.resnet_cifar.loader.to_device,
the hook that counts transfers): the batch is gathered from the memory map on the host, so only
the pages a batch touches are read and nothing of the split has to fit in device memory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scalestudy.data.preprocess import PackedDataError, _load_array
from scalestudy.data.tokenize import MANIFEST, SPLITS, TOKEN_DTYPE, TOKENIZERS, tokens_file
from scalestudy.workloads.resnet_cifar import loader

Batch = tuple[torch.Tensor, torch.Tensor]
SEED_STRIDE = 1_000_003  # epoch e of seed s draws its order from generator seed s * SEED_STRIDE + e
_CHUNK = 1 << 24  # bytes read at a time when checking a token file (even: whole tokens)


def read_manifest(data_dir: str | os.PathLike) -> dict[str, Any]:
    """The tokenize rule's manifest.json, with its tokenizer and vocabulary checked."""
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise PackedDataError(f"{path}: missing (the tokenize rule writes it)")
    try:
        manifest = json.loads(path.read_text())
        tokenizer, vocab_size = manifest["tokenizer"], manifest["vocab_size"]
        files, splits = manifest["files"], manifest["splits"]
        if not isinstance(files, dict) or not isinstance(splits, dict):
            raise TypeError("'files' and 'splits' must be objects")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise PackedDataError(f"{path}: unreadable manifest ({type(error).__name__}: {error})") from None
    known = TOKENIZERS.get(tokenizer)
    if known is None:
        raise PackedDataError(f"{path}: unknown tokenizer {tokenizer!r} (known: {', '.join(TOKENIZERS)})")
    if vocab_size != known.vocab_size:
        raise PackedDataError(
            f"{path}: vocab_size {vocab_size!r}, but tokenizer {tokenizer} has {known.vocab_size}"
        )
    return manifest


def load_tokens(data_dir: str | os.PathLike, split: str) -> np.ndarray:
    """A split's tokens, uint16 [N], memory-mapped read-only, checked against manifest.json.

    Any fault (no manifest, a file missing, cut short, of another dtype or length than recorded,
    content whose sha256 is not the recorded one, a token outside the vocabulary) is a
    PackedDataError naming the file.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    name = tokens_file(split)
    path = data_dir / name
    recorded = manifest["files"].get(name)
    if not isinstance(recorded, dict):
        raise PackedDataError(f"{data_dir / MANIFEST}: no record of {name}")
    tokens = _load_array(path, recorded, mmap=True)  # header, size, and shape/dtype/bytes as recorded
    count = (manifest["splits"].get(split) or {}).get("tokens")
    if tokens.dtype != TOKEN_DTYPE or tokens.ndim != 1 or len(tokens) != count:
        raise PackedDataError(
            f"{path}: {tokens.dtype} {list(tokens.shape)}, but {data_dir / MANIFEST} records"
            f" {count} {split} tokens of {np.dtype(TOKEN_DTYPE)}"
        )
    top = _verify(path, tokens, recorded, data_dir / MANIFEST)
    if top >= manifest["vocab_size"]:
        raise PackedDataError(f"{path}: token {top} is outside the vocabulary of {manifest['vocab_size']}")
    return tokens


_VERIFIED: dict[tuple, int] = {}  # (file identity, recorded sha256) -> largest token: once per process


def _verify(path: Path, tokens: np.ndarray, recorded: dict[str, Any], manifest: Path) -> int:
    """The file's sha256 against the manifest's record, and its largest token, in one sequential
    pass over the file (hashlib: 0.76 GB/s on a 2-core EPYC guest, about 13 s per 10 GB and rank;
    the vocabulary check reads every token anyway). A file checked before in this process
    (same inode, size and mtime) is not read again."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, recorded.get("sha256"))
    if key in _VERIFIED:
        return _VERIFIED[key]
    hasher, top = hashlib.sha256(), -1
    with open(path, "rb") as handle:
        hasher.update(handle.read(stat.st_size - tokens.nbytes))  # the .npy header
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
            top = max(top, int(np.frombuffer(chunk, dtype=TOKEN_DTYPE).max()))
    digest = hasher.hexdigest()
    if digest != recorded.get("sha256"):
        raise PackedDataError(
            f"{path}: sha256 {digest}, but {manifest} records {recorded.get('sha256')!r}: these are not "
            "the tokens the tokenize rule wrote (replaced or damaged): run it again"
        )
    _VERIFIED[key] = top
    return top


def train_order(windows: int, epoch: int, seed: int) -> torch.Tensor:
    """Epoch `epoch`'s order of all windows: the same for every rank and every world size."""
    generator = torch.Generator().manual_seed(seed * SEED_STRIDE + epoch)
    return torch.randperm(windows, generator=generator)


class TokenLoader:
    """(x, y) int64 [B, seq_len] batches on `device`; see the module docstring for the order."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        device: torch.device | str = "cpu",
        train: bool = True,
        max_steps: int | None = None,
    ) -> None:
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("world_size", world_size)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in 0..{world_size - 1}, got {rank}")
        self.tokens, self.seq_len, self.batch_size = tokens, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.device, self.train = torch.device(device), train
        self.windows = len(tokens) // (seq_len + 1)
        self.global_batch = batch_size * world_size
        if train:
            if self.windows < self.global_batch:
                raise ValueError(
                    f"{len(tokens)} tokens give {self.windows} windows of seq_len + 1 = {seq_len + 1},"
                    f" fewer than one global batch of {batch_size} x {world_size} ranks = {self.global_batch}"
                )
            full = self.windows // self.global_batch
        else:
            if self.windows < 1:
                raise ValueError(f"{len(tokens)} tokens hold no window of seq_len + 1 = {seq_len + 1}")
            full = -(-self.windows // self.global_batch)  # same count on every rank
        self.steps_per_epoch = min(full, max_steps) if max_steps is not None else full
        self.tokens_per_step = batch_size * seq_len  # this rank's, in a full batch

    def epoch_windows(self, epoch: int) -> torch.Tensor:
        """This rank's window indices for the epoch, in batch order (batch_size per step)."""
        if not self.train:
            return torch.arange(self.rank, self.windows, self.world_size)
        order = train_order(self.windows, epoch, self.seed)[: self.steps_per_epoch * self.global_batch]
        per_step = order.view(self.steps_per_epoch, self.world_size, self.batch_size)
        return per_step[:, self.rank].reshape(-1)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[Batch]:
        """Batches (x, y) of steps start_step.. of this epoch; a resumed epoch continues exactly."""
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step must lie in 0..{self.steps_per_epoch}, got {start_step}")
        return self._batches(self.epoch_windows(epoch).numpy(), start_step)

    def _batches(self, windows: np.ndarray, start_step: int) -> Iterator[Batch]:
        span = np.arange(self.seq_len + 1)
        for step in range(start_step, self.steps_per_epoch):
            chosen = windows[step * self.batch_size : (step + 1) * self.batch_size]
            rows = self.tokens[chosen[:, None] * (self.seq_len + 1) + span]
            batch = loader.to_device(torch.from_numpy(rows.astype(np.int64)), self.device)
            yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # contiguous: y.view(-1) works
