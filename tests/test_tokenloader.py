"""The LM's token loader: checked loading, known batches, an order that does not depend on the
rank count (so a checkpoint resumes at another world size), exact resume, exact evaluation."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from scalestudy.data import tokenize as tokenizing
from scalestudy.data.preprocess import PackedDataError
from scalestudy.workloads.gpt.loader import SEED_STRIDE, TokenLoader, load_tokens, read_manifest, train_order
from scalestudy.workloads.resnet_cifar import loader


def _tokens(count: int) -> np.ndarray:
    return np.arange(count, dtype=np.uint16)


def _batches(data: TokenLoader, epoch: int = 0, start_step: int = 0) -> list[tuple[list, list]]:
    return [(x.tolist(), y.tolist()) for x, y in data.epoch(epoch, start_step)]


def _global_batches(ranks: list[TokenLoader], epoch: int, start_step: int = 0) -> list[list]:
    """Per step, the inputs of all ranks concatenated in rank order."""
    per_rank = [_batches(data, epoch, start_step) for data in ranks]
    return [sum((steps[step][0] for steps in per_rank), []) for step in range(len(per_rank[0]))]


def _world(tokens: np.ndarray, world_size: int, **options) -> list[TokenLoader]:
    return [TokenLoader(tokens, rank=rank, world_size=world_size, **options) for rank in range(world_size)]


# --- known answers ---------------------------------------------------------------------------------


def test_evaluation_batches_by_hand():
    """20 tokens, seq_len 3: 5 windows [0..3], [4..7], ...; 2 ranks x batch 2 take 0, 2 | 4 and 1, 3."""
    first, second = _world(_tokens(20), 2, seq_len=3, batch_size=2, train=False)
    assert first.steps_per_epoch == second.steps_per_epoch == 2  # the same on every rank (FSDP)
    assert _batches(first) == [
        ([[0, 1, 2], [8, 9, 10]], [[1, 2, 3], [9, 10, 11]]),
        ([[16, 17, 18]], [[17, 18, 19]]),
    ]
    (x, y), (last_x, last_y) = list(second.epoch(0))
    assert x.tolist() == [[4, 5, 6], [12, 13, 14]] and y.tolist() == [[5, 6, 7], [13, 14, 15]]
    assert last_x.shape == last_y.shape == (0, 3)  # nothing left for rank 1: an empty batch


def test_training_windows_are_whole_disjoint_sequences_shifted_by_one():
    """21 tokens, seq_len 4: 4 windows of 5 tokens (the last token is left over)."""
    data = TokenLoader(_tokens(21), seq_len=4, batch_size=2, seed=3)
    assert (data.windows, data.steps_per_epoch, data.tokens_per_step) == (4, 2, 8)
    rows = []
    for x, y in data.epoch(0):
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(y, x + 1)
        rows += x.tolist()
    order = train_order(4, epoch=0, seed=3).tolist()
    assert rows == [[5 * window + offset for offset in range(4)] for window in order]
    assert sorted(order) == [0, 1, 2, 3]


def test_the_order_is_the_documented_generator():
    generator = torch.Generator().manual_seed(7 * SEED_STRIDE + 2)
    assert torch.equal(train_order(50, epoch=2, seed=7), torch.randperm(50, generator=generator))
    assert not torch.equal(train_order(50, epoch=2, seed=7), train_order(50, epoch=3, seed=7))
    assert not torch.equal(train_order(50, epoch=2, seed=7), train_order(50, epoch=2, seed=8))


# --- invariances -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("world_size", "batch_size"), [(2, 8), (4, 4), (16, 1)])
def test_the_global_batch_does_not_depend_on_the_rank_count(world_size, batch_size):
    tokens = _tokens(33 * 60 + 7)  # 60 windows of seq_len 32 + 1
    single = _world(tokens, 1, seq_len=32, batch_size=16, seed=5)
    split = _world(tokens, world_size, seq_len=32, batch_size=batch_size, seed=5)
    assert split[0].steps_per_epoch == single[0].steps_per_epoch == 3
    for epoch in range(3):
        assert _global_batches(split, epoch) == _global_batches(single, epoch)


def test_a_resumed_epoch_continues_exactly_even_at_another_world_size():
    tokens = _tokens(17 * 64)
    one = TokenLoader(tokens, seq_len=16, batch_size=8, seed=1)
    whole = _batches(one, epoch=2)
    assert _batches(one, epoch=2, start_step=5) == whole[5:]
    assert _batches(one, epoch=2, start_step=one.steps_per_epoch) == []
    two = _world(tokens, 2, seq_len=16, batch_size=4, seed=1)
    assert _global_batches(two, epoch=2, start_step=5) == [x for x, _ in whole[5:]]


def test_an_epoch_repeats_no_window_and_epochs_differ():
    ranks = _world(_tokens(9 * 50), 3, seq_len=8, batch_size=4, seed=0)
    assert ranks[0].steps_per_epoch == 4  # 50 windows // 12: 2 left over
    firsts = []
    for epoch in range(2):
        windows = torch.cat([data.epoch_windows(epoch) for data in ranks]).tolist()
        assert len(windows) == len(set(windows)) == 48
        firsts.append([x[0] for x, _ in _batches(ranks[0], epoch)])
    assert firsts[0] != firsts[1]
    again = TokenLoader(_tokens(9 * 50), seq_len=8, batch_size=4, rank=0, world_size=3, seed=0)
    assert [x[0] for x, _ in _batches(again, 0)] == firsts[0]


@pytest.mark.parametrize(
    ("windows", "world_size", "batch_size", "max_steps"),
    [(5, 2, 2, None), (13, 4, 3, None), (3, 4, 2, None), (64, 2, 8, None), (100, 3, 7, 2)],
)
def test_evaluation_sees_every_window_exactly_once(windows, world_size, batch_size, max_steps):
    seq_len = 4
    ranks = _world(
        _tokens(windows * (seq_len + 1) + 3), world_size, seq_len=seq_len, batch_size=batch_size,
        train=False, max_steps=max_steps,
    )  # fmt: skip
    assert len({data.steps_per_epoch for data in ranks}) == 1
    seen = []
    for data in ranks:
        for x, y in data.epoch(0):
            assert len(x) <= batch_size and torch.equal(y, x + 1)
            seen += [row[0] // (seq_len + 1) for row in x.tolist()]
    limit = windows if max_steps is None else min(windows, max_steps * batch_size * world_size)
    assert sorted(seen) == list(range(limit))


def test_max_steps_caps_an_epoch():
    data = TokenLoader(_tokens(5 * 40), seq_len=4, batch_size=2, max_steps=3)
    assert data.steps_per_epoch == 3 and len(list(data.epoch(0))) == 3
    assert TokenLoader(_tokens(5 * 40), seq_len=4, batch_size=2, max_steps=99).steps_per_epoch == 20


def test_one_host_to_device_copy_per_batch(monkeypatch):
    copies = []
    real = loader.to_device

    def counted(tensor, device, **options):
        copies.append(tuple(tensor.shape))
        return real(tensor, device, **options)

    monkeypatch.setattr(loader, "to_device", counted)
    data = TokenLoader(_tokens(9 * 40), seq_len=8, batch_size=4, device="cpu")
    assert copies == []
    batches = data.epoch(0)
    for step in range(data.steps_per_epoch):
        next(batches)
        assert copies == [(4, 9)] * (step + 1)


# --- errors ----------------------------------------------------------------------------------------


def test_too_few_windows_for_one_global_batch_names_the_numbers():
    with pytest.raises(ValueError, match=r"100 tokens give 5 windows of seq_len \+ 1 = 20, fewer than one"
                       r" global batch of 4 x 2 ranks = 8"):  # fmt: skip
        TokenLoader(_tokens(100), seq_len=19, batch_size=4, world_size=2)
    with pytest.raises(ValueError, match=r"10 tokens hold no window of seq_len \+ 1 = 20"):
        TokenLoader(_tokens(10), seq_len=19, batch_size=4, train=False)
    with pytest.raises(ValueError, match=r"rank must lie in 0..1, got 2"):
        TokenLoader(_tokens(100), seq_len=3, batch_size=1, rank=2, world_size=2)
    with pytest.raises(ValueError, match="seq_len must be positive, got 0"):
        TokenLoader(_tokens(100), seq_len=0, batch_size=1)
    with pytest.raises(ValueError, match=r"start_step must lie in 0..25, got 26"):
        TokenLoader(_tokens(100), seq_len=3, batch_size=1).epoch(0, start_step=26)


# --- loading the packed arrays ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def packed_original(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokens")
    corpus = folder / "corpus.txt"
    corpus.write_bytes("Ein kleiner Text über Bytes. ".encode() * 40)
    tokenizing.tokenize(corpus, folder / "packed", test_fraction=0.25, seq_len=16)
    return folder / "packed"


@pytest.fixture
def packed(packed_original, tmp_path) -> Path:
    return Path(shutil.copytree(packed_original, tmp_path / "packed"))


def test_load_tokens_maps_the_checked_arrays(packed):
    corpus = "Ein kleiner Text über Bytes. ".encode() * 40
    train, test = load_tokens(packed, "train"), load_tokens(packed, "test")
    assert isinstance(train, np.memmap) and train.dtype == np.uint16 and not train.flags.writeable
    assert bytes(np.concatenate([train, test]).astype(np.uint8)) == corpus
    assert len(test) == round(len(corpus) * 0.25)
    assert read_manifest(packed)["vocab_size"] == 256


def _edit_manifest(packed: Path, change) -> None:
    path = packed / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _replace_test_array(packed: Path, array: np.ndarray, record_it: bool) -> None:
    path = packed / "test_tokens.npy"
    np.save(path, array)

    def record(manifest):
        manifest["files"]["test_tokens.npy"].update(
            shape=list(array.shape),
            dtype=str(array.dtype),
            bytes=path.stat().st_size,
            sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        )

    if record_it:
        _edit_manifest(packed, record)


def _truncate(packed: Path) -> None:
    path = packed / "test_tokens.npy"
    path.write_bytes(path.read_bytes()[:-10])


BREAKAGES = {
    "no manifest": (
        lambda p: (p / "manifest.json").unlink(),
        "manifest.json: missing (the tokenize rule writes it)",
    ),
    "not json": (
        lambda p: (p / "manifest.json").write_text("{"),
        "manifest.json: unreadable manifest (JSONDecodeError",
    ),
    "no tokenizer": (
        lambda p: _edit_manifest(p, lambda m: m.pop("tokenizer")),
        "unreadable manifest (KeyError",
    ),
    "other tokenizer": (
        lambda p: _edit_manifest(p, lambda m: m.update(tokenizer="gpt2")),
        "manifest.json: unknown tokenizer 'gpt2' (known: bytes)",
    ),
    "other vocabulary": (
        lambda p: _edit_manifest(p, lambda m: m.update(vocab_size=512)),
        "manifest.json: vocab_size 512, but tokenizer bytes has 256",
    ),
    "array missing": (lambda p: (p / "test_tokens.npy").unlink(), "test_tokens.npy: missing"),
    "array unrecorded": (
        lambda p: _edit_manifest(p, lambda m: m["files"].pop("test_tokens.npy")),
        "manifest.json: no record of test_tokens.npy",
    ),
    "cut short": (_truncate, "test_tokens.npy: 718 bytes, but its header (uint16 (300,)) needs 728"),
    "other count": (
        lambda p: _edit_manifest(p, lambda m: m["splits"]["test"].update(tokens=299)),
        "test_tokens.npy: uint16 [300], but",
    ),
    "unrecorded change": (
        lambda p: _replace_test_array(p, np.zeros(300, dtype=np.int32), record_it=False),
        "test_tokens.npy: {'dtype': 'int32', 'bytes': 1328} but",
    ),
    "recorded int32": (
        lambda p: _replace_test_array(p, np.zeros(300, dtype=np.int32), record_it=True),
        "test_tokens.npy: int32 [300], but",
    ),
    "other tokens of the same shape": (
        lambda p: np.save(p / "test_tokens.npy", np.load(p / "test_tokens.npy")[::-1].copy()),
        "test_tokens.npy: sha256 ",
    ),
    "sha256 zeroed": (
        lambda p: _edit_manifest(p, lambda m: m["files"]["test_tokens.npy"].update(sha256="0" * 64)),
        f"manifest.json records '{'0' * 64}': these are not the tokens the tokenize rule wrote",
    ),
    "token outside the vocabulary": (
        lambda p: _replace_test_array(p, np.full(300, 300, dtype=np.uint16), record_it=True),
        "test_tokens.npy: token 300 is outside the vocabulary of 256",
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_damaged_or_mismatched_split_is_refused_naming_the_file(packed, breakage):
    damage, message = BREAKAGES[breakage]
    damage(packed)
    with pytest.raises(PackedDataError) as caught:
        load_tokens(packed, "test")
    assert str(caught.value).startswith(str(packed)) and message in str(caught.value), str(caught.value)


def test_an_unknown_split_is_refused(packed):
    with pytest.raises(ValueError, match="split must be one of"):
        load_tokens(packed, "validation")
