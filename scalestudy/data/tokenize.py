"""Tokenise a text corpus into packed uint16 token arrays for the LM.

    python -m scalestudy.data.tokenize --corpus results/data/corpus.txt \\
        --out-dir results/data/packed --seq-len 128 [--test-fraction 0.1] [--tokenizer bytes]

writes train_tokens.npy and test_tokens.npy (1-D uint16, np.save format; the LAST test_fraction of
the corpus's bytes is the test split, so no test text is seen in training) and manifest.json
(tokenizer, vocab_size, token counts per split, sha256 of the corpus and of every output,
provenance). The corpus and the options are validated before anything is written; an error names
the file and what is wrong and leaves no output behind. Exit status 1 for a bad corpus or option
value, 2 for a malformed command line.

Tokenizers: `bytes` (vocabulary of the 256 byte values, one token per byte: nothing to download
or train, any encoding works). Another tokenizer is one more entry in TOKENIZERS: a name, a
vocabulary size of at most 65,536 (uint16 tokens) and an `encode(bytes) -> uint16 array`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scalestudy import provenance
from scalestudy.atomic import atomic_path, write_json
from scalestudy.data import file_digests
from scalestudy.data.preprocess import _file_record
from scalestudy.plan import schema
from scalestudy.plan.paths import PACKED_MANIFEST as MANIFEST
from scalestudy.progress import Progress, setup_logging

log = logging.getLogger("scalestudy.data.tokenize")

SPLITS = ("train", "test")
TOKEN_DTYPE = np.uint16
DEFAULT_TEST_FRACTION = schema.node("data", "test_fraction")["default"]
_CHUNK_BYTES = 1 << 22


class CorpusError(Exception):
    """The corpus or an option cannot give usable token arrays; the message names which and why."""


@dataclass(frozen=True)
class Tokenizer:
    name: str
    vocab_size: int
    encode: Callable[[bytes], np.ndarray]  # a split's bytes -> uint16 tokens
    one_token_per_byte: bool  # token counts known from the size; the bytes may be encoded in chunks

    def __post_init__(self) -> None:
        if not 1 < self.vocab_size <= np.iinfo(TOKEN_DTYPE).max + 1:
            raise ValueError(
                f"tokenizer {self.name}: vocab_size {self.vocab_size} does not fit uint16 tokens"
            )


def _encode_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).astype(TOKEN_DTYPE)


TOKENIZERS = {"bytes": Tokenizer("bytes", 256, _encode_bytes, one_token_per_byte=True)}


def tokens_file(split: str) -> str:
    return f"{split}_tokens.npy"


def get_tokenizer(name: str) -> Tokenizer:
    try:
        return TOKENIZERS[name]
    except KeyError:
        raise CorpusError(f"unknown tokenizer {name!r}: one of {', '.join(TOKENIZERS)}") from None


def split_bytes(size: int, test_fraction: float) -> dict[str, range]:
    """The byte ranges of the splits: the last round(size * test_fraction) bytes are test."""
    test = round(size * test_fraction)
    return {"train": range(0, size - test), "test": range(size - test, size)}


def plan(corpus: Path, test_fraction: float, tokenizer: Tokenizer, seq_len: int) -> dict[str, range]:
    """Check everything that can be checked before work starts; return the splits' byte ranges."""
    share = schema.rule_of(schema.node("data", "test_fraction"))  # the schema's range: (0, 1)
    if not share.accepts(test_fraction):
        raise CorpusError(f"--test-fraction must be {share.describe()}, got {test_fraction}")
    if seq_len < 1:
        raise CorpusError(f"--seq-len must be at least 1, got {seq_len}")
    if not corpus.exists():
        raise CorpusError(f"{corpus}: no such file (the fetch rule writes it)")
    if not corpus.is_file():
        raise CorpusError(f"{corpus}: not a regular file")
    size = corpus.stat().st_size
    if size == 0:
        raise CorpusError(f"{corpus}: the corpus is empty")
    ranges = split_bytes(size, test_fraction)
    if tokenizer.one_token_per_byte:
        _check_lengths(corpus, {split: len(part) for split, part in ranges.items()}, test_fraction, seq_len)
    return ranges


def _check_lengths(corpus: Path, tokens: dict[str, int], test_fraction: float, seq_len: int) -> None:
    for split, count in tokens.items():
        if count < seq_len + 1:
            raise CorpusError(
                f"{corpus}: too short for one sequence of {split} data: {count} {split} tokens"
                f" (test fraction {test_fraction}) but a sequence needs seq_len + 1 = {seq_len + 1}"
            )


def encode_split(corpus: Path, part: range, tokenizer: Tokenizer, split: str) -> np.ndarray:
    progress = Progress(f"tokenise {split} split of {corpus.name}", len(part), unit="B", logger=log)
    step = _CHUNK_BYTES if tokenizer.one_token_per_byte else max(len(part), 1)
    pieces = []
    with open(corpus, "rb") as handle:
        handle.seek(part.start)
        for start in range(part.start, part.stop, step):
            data = handle.read(min(step, part.stop - start))
            pieces.append(tokenizer.encode(data))
            progress.advance(len(data))
    tokens = np.concatenate(pieces) if pieces else np.empty(0, dtype=TOKEN_DTYPE)
    return tokens.astype(TOKEN_DTYPE, copy=False)


def tokenize(
    corpus: str | Path,
    out_dir: str | Path,
    test_fraction: float = DEFAULT_TEST_FRACTION,
    tokenizer_name: str = "bytes",
    *,
    seq_len: int,
) -> dict[str, Any]:
    """Write the token arrays and manifest.json to `out_dir`; return the manifest."""
    corpus, out_dir = Path(corpus), Path(out_dir)
    tokenizer = get_tokenizer(tokenizer_name)
    ranges = plan(corpus, test_fraction, tokenizer, seq_len)
    arrays = {split: encode_split(corpus, ranges[split], tokenizer, split) for split in SPLITS}
    _check_lengths(corpus, {split: len(tokens) for split, tokens in arrays.items()}, test_fraction, seq_len)
    with contextlib.ExitStack() as renames:  # every file renamed into place only if all were written
        temporary = {
            split: renames.enter_context(atomic_path(out_dir / tokens_file(split), suffix=".npy"))
            for split in SPLITS
        }
        for split, path in temporary.items():
            np.save(path, arrays[split])
        manifest = _manifest(corpus, tokenizer, test_fraction, ranges, arrays, temporary)
        (out_dir / MANIFEST).unlink(missing_ok=True)  # an old manifest must not vouch for new arrays
    write_json(out_dir / MANIFEST, manifest)
    log.info(
        "wrote %s: %s (%s tokenizer, vocabulary %d)",
        out_dir,
        ", ".join(f"{split} {len(arrays[split]):,} tokens" for split in SPLITS),
        tokenizer.name,
        tokenizer.vocab_size,
    )
    return manifest


def _manifest(
    corpus: Path,
    tokenizer: Tokenizer,
    test_fraction: float,
    ranges: dict[str, range],
    arrays: dict[str, np.ndarray],
    temporary: dict[str, Path],
) -> dict[str, Any]:
    corpus_sha256 = file_digests(corpus, ("sha256",))["sha256"]
    return {
        "corpus": {"path": str(corpus), "sha256": corpus_sha256, "bytes": corpus.stat().st_size},
        "tokenizer": tokenizer.name,
        "vocab_size": tokenizer.vocab_size,
        "token_layout": "uint16 [N] per split, np.save format; test = the corpus's last bytes",
        "test_fraction": test_fraction,
        "splits": {
            split: {"tokens": len(arrays[split]), "corpus_bytes": [ranges[split].start, ranges[split].stop]}
            for split in SPLITS
        },
        "files": {tokens_file(split): _file_record(temporary[split], arrays[split]) for split in SPLITS},
        "provenance": provenance.collect(extra={"corpus_sha256": corpus_sha256}),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.data.tokenize", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--corpus", type=Path, required=True, help="the text corpus (results/data/corpus.txt)"
    )
    parser.add_argument(
        "--out-dir", type=Path, required=True, help="folder for the token arrays and manifest.json"
    )
    parser.add_argument(
        "--test-fraction",
        type=float,
        default=DEFAULT_TEST_FRACTION,
        help=f"share of the corpus (its end) held out as test data (default {DEFAULT_TEST_FRACTION})",
    )
    parser.add_argument(
        "--tokenizer", default="bytes", help=f"one of: {', '.join(TOKENIZERS)} (default bytes)"
    )
    parser.add_argument(
        "--seq-len",
        type=int,
        required=True,
        help="the model's sequence length: each split must hold at least one sequence (seq_len + 1 tokens)",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    try:
        tokenize(args.corpus, args.out_dir, args.test_fraction, args.tokenizer, seq_len=args.seq_len)
    except (CorpusError, OSError) as error:  # OSError: e.g. an unreadable corpus, an unwritable folder
        print(f"tokenize: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
