"""Fetch the CIFAR-10 archive or a text corpus (mirrors first, then the URL), or synthesise either.

    python -m scalestudy.data.fetch --source cifar10 --out results/data/cifar-10-python.tar.gz \\
        [--mirror /shared/datasets/cifar-10-python.tar.gz ...]
    python -m scalestudy.data.fetch --source text --out results/data/corpus.txt --url URL \\
        [--mirror PATH ...] [--sha256 ...]      (a text corpus has no default URL)
    python -m scalestudy.data.fetch --source synthetic-text --out results/data/corpus.txt \\
        --text-bytes 600000 --seed 1234          (the offline demo corpus, scalestudy.data.synthetic_text)

A source is a local path (a file, or a folder holding a file named like the output), a file:// URL
or an http(s) URL; a private one authenticates from ~/.netrc ($NETRC) or the environment variable
`--credentials-env` names (scalestudy.data.auth), never from the URL, which is refused if it holds
credentials. Local copies are copied (never linked: the output is this run's file, with the
umask's mode and a fresh mtime, and the source stays exactly as it was) without the network. HTTP
downloads stream into `<out>.part`, resume it with a Range request after an interruption, and retry
with exponential backoff. Every result is checked against the expected size and md5/sha256 before
it is renamed onto the output, so the output exists only if it is complete and verified.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from scalestudy.atomic import atomic_path
from scalestudy.data import auth, file_digests
from scalestudy.plan import credentials, schema
from scalestudy.progress import Progress, setup_logging

log = logging.getLogger("scalestudy.data.fetch")

# The defaults of the command line and of fetch(): the schema's data section (its url, md5 and
# size_bytes are the official CIFAR-10 archive's), and of its synthetic data.
DEFAULTS = schema.defaults("data")
SYNTHETIC = schema.defaults("data", "synthetic")
SYNTHETIC_TEXT = schema.defaults("data", "synthetic_text")

CHUNK_BYTES = 1 << 20
MAX_BACKOFF_S = 60.0
# HTTP statuses worth retrying: the server may answer differently in a moment.
RETRYABLE_STATUSES = {408, 425, 429, 500, 502, 503, 504}


class FetchError(Exception):
    """A failure the user can act on; the command line prints it as one line."""


class ChecksumMismatch(FetchError):
    pass


class AllSourcesFailed(FetchError):
    def __init__(self, out: Path, failures: list[tuple[str, Exception]]) -> None:
        self.failures = failures
        reasons = "; ".join(
            f"[{number}] {credentials.redact(source)}: {error}"
            for number, (source, error) in enumerate(failures, 1)
        )
        super().__init__(f"could not fetch {out.name} from any of {len(failures)} source(s): {reasons}")


class _RetryableError(FetchError):
    """A transfer that broke off in a way another attempt (resuming the .part file) may fix."""


@dataclass(frozen=True)
class Expected:
    """What the fetched file must be; None means "not checked"."""

    size: int | None = None
    md5: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        for name, length in (("md5", 32), ("sha256", 64)):
            value = getattr(self, name)
            if value is None:
                continue
            if not re.fullmatch(f"[0-9a-fA-F]{{{length}}}", value):
                raise ValueError(f"{name} must be {length} hex digits, got {value!r}")
            object.__setattr__(self, name, value.lower())
        if self.size is not None and self.size < 0:
            raise ValueError(f"size must not be negative, got {self.size}")

    @property
    def has_checksum(self) -> bool:
        return self.md5 is not None or self.sha256 is not None


def verify(path: Path, expected: Expected, source: str) -> None:
    """Raise ChecksumMismatch (naming the source and both values) unless `path` is as expected."""
    actual_size = path.stat().st_size
    if expected.size is not None and actual_size != expected.size:
        raise ChecksumMismatch(
            f"size mismatch for {source}: expected {expected.size} bytes, got {actual_size}"
        )
    wanted = {name: value for name, value in (("md5", expected.md5), ("sha256", expected.sha256)) if value}
    if not wanted:
        log.warning("no md5/sha256 given: %s is used unverified", source)
        return
    actual = file_digests(path, wanted)
    for name, value in wanted.items():
        if actual[name] != value:
            raise ChecksumMismatch(f"{name} mismatch for {source}: expected {value}, got {actual[name]}")
    log.info("verified %s (%s)", source, ", ".join(f"{name} {value}" for name, value in wanted.items()))


def fetch(
    sources: Sequence[str],
    out: str | os.PathLike,
    expected: Expected,
    timeout_s: float = DEFAULTS["timeout_s"],
    retries: int = DEFAULTS["retries"],
    backoff_s: float = 1.0,
    credentials_env: str | None = None,
) -> Path:
    """Fetch `out` from the first source that delivers a verified file; return its path.

    An existing `out` that matches a given checksum is kept as it is. Raises AllSourcesFailed,
    which lists every source tried and why it failed. HTTP(S) sources authenticate from the netrc
    file or the environment variable `credentials_env` names (scalestudy.data.auth); a source that
    carries credentials itself is refused (its URL would reach the logs and the rule's command line).
    """
    out = Path(out)
    if out.is_file() and expected.has_checksum and _verifies(out, expected):
        log.info("%s is already present and verified", out)
        return out
    failures: list[tuple[str, Exception]] = []
    for source in sources:
        try:
            _fetch_one(source, out, expected, timeout_s, retries, backoff_s, credentials_env)
            return out
        # OSError: e.g. the output folder is not writable
        except (FetchError, OSError, auth.AuthError) as error:
            log.warning("source %s failed: %s", credentials.redact(source), error)
            failures.append((source, error))
    raise AllSourcesFailed(out, failures)


def _verifies(path: Path, expected: Expected) -> bool:
    try:
        verify(path, expected, str(path))
    except ChecksumMismatch:
        return False
    return True


def _fetch_one(
    source: str,
    out: Path,
    expected: Expected,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    credentials_env: str | None,
) -> None:
    if found := credentials.url_credentials(source):
        raise FetchError(f"the source holds credentials ({', '.join(found)}): {auth.HINT}")
    local = local_path(source)
    if local is None:
        download(source, out, expected, timeout_s, retries, backoff_s, credentials_env)
    else:
        copy_local(local.joinpath(out.name) if local.is_dir() else local, out, expected)


def local_path(source: str) -> Path | None:
    """The file a source names on this machine, or None for an http(s) URL."""
    parsed = urlparse(source)
    if parsed.scheme in ("http", "https"):
        return None
    if parsed.scheme == "file":
        return Path(urllib.request.url2pathname(parsed.path))
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter: a Windows drive, i.e. a path
        raise FetchError(f"unsupported source {source!r}: use a path, file://, http:// or https://")
    return Path(source)


def copy_local(source: Path, out: Path, expected: Expected) -> None:
    """Copy a local file to `out`, verified, atomically; the source is only read.

    Not a hard link: the output's mode (atomic_path sets the umask's) and any later change to it
    (Snakemake's --touch, a rerun replacing it) would be the user's mirror's too.
    """
    if not source.is_file():
        raise FetchError("no such file" if not source.exists() else "not a regular file")
    with atomic_path(out) as tmp:
        _copy_with_progress(source, tmp)
        log.info("copied %s -> %s", source, out)
        verify(tmp, expected, str(source))


def _copy_with_progress(source: Path, target: Path) -> None:
    """The bytes only: not the source's mode (0444 would make the output read-only) nor its mtime
    (an output older than its inputs would be planned again)."""
    progress = Progress(f"copy {source.name}", source.stat().st_size, unit="B", logger=log)
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(CHUNK_BYTES):
            writer.write(chunk)
            progress.advance(len(chunk))


def part_path(out: Path) -> Path:
    """Where a download in progress lives; a stable name so that a later run can resume it."""
    return out.with_name(out.name + ".part")


def download(
    url: str,
    out: Path,
    expected: Expected,
    timeout_s: float = DEFAULTS["timeout_s"],
    retries: int = DEFAULTS["retries"],
    backoff_s: float = 1.0,
    credentials_env: str | None = None,
) -> None:
    """Download `url` to `out` via `<out>.part`, resuming and retrying; verify before the rename.

    If a resumed download fails verification, the stale start may be to blame: the .part file is
    dropped and the download made once more from the beginning.
    """
    part = part_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    login = auth.SourceAuth(url, credentials_env)
    resumed = _download_with_retries(url, part, expected, timeout_s, retries, backoff_s, login)
    try:
        _verify_or_discard(part, expected, url)
    except ChecksumMismatch as error:
        if not resumed:
            raise
        log.warning("%s; downloading again from the start", error)
        _download_with_retries(url, part, expected, timeout_s, retries, backoff_s, login)
        _verify_or_discard(part, expected, url)
    os.replace(part, out)


def _verify_or_discard(part: Path, expected: Expected, url: str) -> None:
    try:
        verify(part, expected, url)
    except ChecksumMismatch:
        part.unlink(missing_ok=True)
        raise


def _download_with_retries(
    url: str,
    part: Path,
    expected: Expected,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    login: auth.SourceAuth,
) -> bool:
    """Run transfer attempts until one completes; return whether the last one resumed a .part file."""
    attempt = 0
    while True:
        try:
            return _transfer(url, part, expected, timeout_s, login)
        except (_RetryableError, OSError, http.client.HTTPException) as error:
            attempt += 1
            if attempt > retries:
                raise FetchError(f"gave up after {attempt} attempt(s): {_describe(error)}") from error
            delay = min(backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
            log.warning(
                "attempt %d for %s failed (%s); retrying in %.1f s", attempt, url, _describe(error), delay
            )
            time.sleep(delay)


def _describe(error: BaseException) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"HTTP {error.code} {error.reason}"
    if isinstance(error, urllib.error.URLError):
        return str(error.reason)
    return str(error) or type(error).__name__


def _transfer(url: str, part: Path, expected: Expected, timeout_s: float, login: auth.SourceAuth) -> bool:
    """One attempt: request the rest of the file after what `part` holds; return whether it resumed."""
    have = part.stat().st_size if part.exists() else 0
    if expected.size is not None and have > expected.size:
        part.unlink()  # longer than the file can be: not a prefix of it
        have = 0
    if expected.size is not None and have == expected.size:
        return have > 0  # already complete; verification decides
    try:
        response = _open(url, have, timeout_s, login)
    except urllib.error.HTTPError as error:
        return _handle_http_error(error, part, have, login)
    with response:
        start = _resume_offset(response, have)
        length = response.headers.get("Content-Length")
        total = start + int(length) if length is not None else expected.size
        _stream(response, part, start, total)
    return start > 0


def _open(url: str, have: int, timeout_s: float, login: auth.SourceAuth) -> http.client.HTTPResponse:
    """The response to a GET of `url` from byte `have` on, with the source's credentials (once more
    with the environment's after a 401 to a request without them: auth.SourceAuth)."""
    while True:
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        if (credential := login.login()) is not None:
            request.add_unredirected_header("Authorization", credential.header)  # not past a redirect
        try:
            return urllib.request.build_opener().open(request, timeout=timeout_s)
        except urllib.error.HTTPError as error:
            if error.code != 401 or not login.answer_challenge():
                raise
            error.close()


def _handle_http_error(error: urllib.error.HTTPError, part: Path, have: int, login: auth.SourceAuth) -> bool:
    error.close()
    if error.code in (401, 403):
        raise FetchError(login.refused(error.code, error.reason))
    if error.code == 416 and have:
        # Nothing after `have`: complete if the server's size agrees, otherwise start over.
        if _content_range_total(error.headers.get("Content-Range")) == have:
            return True
        part.unlink(missing_ok=True)
        raise _RetryableError("the server refused to resume a partial download; starting over")
    if error.code in RETRYABLE_STATUSES:
        raise _RetryableError(_describe(error))
    raise FetchError(_describe(error))


def _resume_offset(response: http.client.HTTPResponse, have: int) -> int:
    """Where the response body starts in the file: `have` for a matching 206, 0 for a 200 (restart)."""
    if response.status == 206:
        match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
        if match is None or int(match.group(1)) != have:
            raise _RetryableError(
                f"server sent range {response.headers.get('Content-Range')!r}, asked from {have}"
            )
        log.info("resuming download at byte %d", have)
        return have
    if have:
        log.info("server ignored the Range request; downloading from the start")
    return 0


def _content_range_total(header: str | None) -> int | None:
    match = re.search(r"/(\d+)\s*$", header or "")
    return int(match.group(1)) if match else None


def _stream(response: http.client.HTTPResponse, part: Path, start: int, total: int | None) -> None:
    progress = Progress(
        f"download {part.name.removesuffix('.part')}", total, unit="B", logger=log, start=start
    )
    with open(part, "r+b" if start else "wb") as handle:
        handle.seek(start)
        handle.truncate()
        while chunk := response.read(CHUNK_BYTES):
            handle.write(chunk)
            progress.advance(len(chunk))
        handle.flush()
        os.fsync(handle.fileno())
    if total is not None and progress.done < total:
        raise _RetryableError(f"connection closed after {progress.done:.0f} of {total} bytes")


def make_synthetic(
    out: Path, train_per_class: int, test_per_class: int, seed: int, expected: Expected
) -> Path:
    """Write the synthetic archive to `out`, verified against `expected` (to pin its checksum)."""
    from scalestudy.data import synthetic_cifar as synthetic

    source = f"synthetic archive (seed {seed}, {train_per_class}/{test_per_class} per class)"
    with atomic_path(out) as tmp:
        synthetic.write_archive(tmp, train_per_class, test_per_class, seed)
        if expected != Expected():
            verify(tmp, expected, source)
    return out


def make_synthetic_text(out: Path, n_bytes: int, seed: int, expected: Expected) -> Path:
    """Write the synthetic text corpus to `out`, verified against `expected` (to pin its checksum)."""
    from scalestudy.data import synthetic_text as textcorpus

    with atomic_path(out) as tmp:
        textcorpus.write_corpus(tmp, n_bytes, seed)
        if expected != Expected():
            verify(tmp, expected, f"synthetic text corpus (seed {seed}, {n_bytes} bytes)")
    return out


def download_args(data: Mapping[str, Any]) -> list[str]:
    """This command's arguments after --out for a download described by a study config's `data:`
    section (mirrors first, then its URL, checked against its size and checksums)."""
    args = ["--url", data["url"], "--md5", data["md5"], "--size", data["size_bytes"]]
    args += ["--timeout", data["timeout_s"], "--retries", data["retries"]]
    if data["sha256"]:
        args += ["--sha256", data["sha256"]]
    for mirror in data["mirrors"]:
        args += ["--mirror", mirror]
    if data["credentials_env"]:  # the variable's name: fetch reads the login from the environment
        args += ["--credentials-env", data["credentials_env"]]
    return [str(arg) for arg in args]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.data.fetch", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--source", choices=("synthetic", "cifar10", "synthetic-text", "text"), required=True)
    parser.add_argument("--out", type=Path, required=True, help="where the archive or corpus goes")
    parser.add_argument(
        "--url", help="tried after the mirrors (cifar10 default: the official URL; text: no default)"
    )
    parser.add_argument(
        "--mirror", action="append", default=[], help="local path or URL; repeatable, in order"
    )
    parser.add_argument(
        "--md5", help="expected md5 (cifar10 default: the official archive's, if no check given)"
    )
    parser.add_argument("--sha256", help="expected sha256")
    parser.add_argument("--size", type=int, help="expected size in bytes")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULTS["timeout_s"], help="seconds without data before a retry"
    )
    parser.add_argument(
        "--retries", type=int, default=DEFAULTS["retries"], help="extra attempts per HTTP source"
    )
    parser.add_argument(
        "--train-per-class",
        type=int,
        default=SYNTHETIC["train_per_class"],
        help="synthetic: training images per class",
    )
    parser.add_argument(
        "--test-per-class",
        type=int,
        default=SYNTHETIC["test_per_class"],
        help="synthetic: test images per class",
    )
    parser.add_argument(
        "--seed", type=int, default=SYNTHETIC["seed"], help="synthetic, synthetic-text: generator seed"
    )
    parser.add_argument(
        "--text-bytes", type=int, default=SYNTHETIC_TEXT["bytes"], help="synthetic-text: corpus size in bytes"
    )
    parser.add_argument(
        "--credentials-env",
        metavar="NAME",
        help="the environment variable holding user:password or a token for the http(s) sources that"
        " ask (401); besides ~/.netrc or $NETRC, which are read for every http(s) source's host",
    )
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def _expected_from(args: argparse.Namespace) -> Expected:
    given = Expected(size=args.size, md5=args.md5, sha256=args.sha256)
    if args.source == "cifar10" and given == Expected():
        return Expected(size=DEFAULTS["size_bytes"], md5=DEFAULTS["md5"])  # nothing given: the official one
    return given


def _sources(args: argparse.Namespace) -> list[str]:
    """The mirrors in order, then the URL (cifar10's official one when none is given)."""
    url = args.url or (DEFAULTS["url"] if args.source == "cifar10" else None)
    if url is None and not args.mirror:
        raise FetchError(
            f"--source {args.source} needs --url or --mirror: a text corpus has no default address"
        )
    return [*args.mirror, *([url] if url else [])]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(getattr(logging, args.log_level))
    try:
        if args.retries < 0:
            raise ValueError(f"--retries must not be negative, got {args.retries}")
        expected = _expected_from(args)
        if args.source == "synthetic":
            make_synthetic(args.out, args.train_per_class, args.test_per_class, args.seed, expected)
        elif args.source == "synthetic-text":
            make_synthetic_text(args.out, args.text_bytes, args.seed, expected)
        else:
            sources = _sources(args)
            fetch(
                sources, args.out, expected, args.timeout, args.retries, credentials_env=args.credentials_env
            )
    except (FetchError, ValueError, OSError) as error:
        print(f"fetch: error: {error}", file=sys.stderr)
        return 1
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
