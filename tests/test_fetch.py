"""Fetching against a real HTTP server on 127.0.0.1: resume, verification, mirrors, failure reports,
a private mirror's login (from a netrc file or a named environment variable; HTTP basic)."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalestudy.data import fetch as fetching
from scalestudy.data import synthetic_cifar as synthetic
from scalestudy.data.fetch import AllSourcesFailed, Expected, fetch
from tests.file_server import FAST, NAME, FileServer, serving


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small synthetic archive (about 450 kB), the file these tests move around."""
    path = tmp_path_factory.mktemp("archive") / NAME
    synthetic.write_archive(path, train_per_class=10, test_per_class=4, seed=0)
    return path.read_bytes()


@pytest.fixture
def server(payload: bytes) -> Iterator[FileServer]:
    with serving({NAME: payload}) as state:
        yield state


def _expected(data: bytes) -> Expected:
    return Expected(
        size=len(data), md5=hashlib.md5(data).hexdigest(), sha256=hashlib.sha256(data).hexdigest()
    )


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{NAME}"


def _leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def test_interrupted_download_resumes_with_a_range_request(server, payload, tmp_path, caplog):
    half = len(payload) // 2
    server.hang_up_after = [half]
    out = tmp_path / NAME
    caplog.set_level("INFO", logger="scalestudy")

    fetch([server.url()], out, _expected(payload), **FAST)

    assert out.read_bytes() == payload
    first, second = server.requests
    assert (first.range, first.status, first.sent) == (None, 200, half)
    assert (second.range, second.status) == (f"bytes={half}-", 206)
    assert second.sent == len(payload) - half  # only the remainder crossed the wire again
    assert _leftovers(tmp_path) == [NAME]
    assert any("resuming download at byte" in message for message in caplog.messages)
    assert any("ETA" in message and "/s" in message for message in caplog.messages)  # progress lines


@pytest.mark.parametrize(("ignore_range", "status"), [(False, 206), (True, 200)])
def test_partial_file_from_an_earlier_run(server, payload, tmp_path, ignore_range, status):
    """A .part left by an earlier run is continued; a server that ignores Range restarts it."""
    out = tmp_path / NAME
    third = len(payload) // 3
    fetching.part_path(out).write_bytes(payload[:third])
    server.ignore_range = ignore_range

    fetch([server.url()], out, _expected(payload), **FAST)

    assert out.read_bytes() == payload
    (request,) = server.requests
    assert (request.range, request.status) == (f"bytes={third}-", status)
    assert request.sent == len(payload) - (third if status == 206 else 0)
    assert _leftovers(tmp_path) == [NAME]


def test_stale_partial_file_that_fails_verification_is_fetched_again(server, payload, tmp_path):
    out = tmp_path / NAME
    fetching.part_path(out).write_bytes(b"x" * 1000)  # not a prefix of the file: resuming gives garbage

    fetch([server.url()], out, _expected(payload), **FAST)

    assert out.read_bytes() == payload
    assert [(request.range, request.status) for request in server.requests] == [
        ("bytes=1000-", 206),
        (None, 200),
    ]


@pytest.mark.parametrize("algorithm", ["md5", "sha256"])
def test_wrong_checksum_names_both_digests_and_leaves_nothing(server, payload, tmp_path, algorithm):
    out = tmp_path / NAME
    wrong = "0" * (32 if algorithm == "md5" else 64)
    actual = hashlib.new(algorithm, payload).hexdigest()

    with pytest.raises(AllSourcesFailed) as caught:
        fetch([server.url()], out, Expected(size=len(payload), **{algorithm: wrong}), **FAST)

    message = str(caught.value)
    assert f"{algorithm} mismatch" in message and wrong in message and actual in message
    assert server.url() in message
    assert isinstance(caught.value.failures[0][1], fetching.ChecksumMismatch)
    assert _leftovers(tmp_path) == []  # neither the output nor a .part that a later run would resume


def test_wrong_size_is_reported(server, payload, tmp_path):
    with pytest.raises(AllSourcesFailed, match=f"expected {len(payload) + 1} bytes, got {len(payload)}"):
        fetch([server.url()], tmp_path / NAME, Expected(size=len(payload) + 1), **FAST)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("form", ["path", "file-url", "folder"])
def test_local_mirror_is_used_without_the_network(server, payload, tmp_path, form):
    mirror_dir = tmp_path / "mirror"
    mirror_dir.mkdir()
    mirror = mirror_dir / NAME
    mirror.write_bytes(payload)
    source = {"path": str(mirror), "file-url": mirror.as_uri(), "folder": str(mirror_dir)}[form]
    out = tmp_path / "data" / NAME

    fetch([source, server.url()], out, _expected(payload), **FAST)

    assert server.requests == []
    assert out.read_bytes() == payload
    assert out.stat().st_ino != mirror.stat().st_ino  # a copy: the output is ours to change
    assert mirror.read_bytes() == payload


def test_a_read_only_mirror_is_left_exactly_as_it_was(server, payload, tmp_path):
    """Issue 13: the mirror was hard-linked into place and then chmod'ed, so 0444 became 0644."""
    mirror = tmp_path / "mirror" / NAME
    mirror.parent.mkdir()
    mirror.write_bytes(payload)
    mirror.chmod(0o444)
    os.utime(mirror, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = mirror.stat()
    out = tmp_path / "data" / NAME

    fetch([str(mirror)], out, _expected(payload), **FAST)

    after = mirror.stat()
    assert stat.S_IMODE(after.st_mode) == 0o444
    assert (after.st_ino, after.st_nlink, after.st_mtime_ns) == (before.st_ino, 1, before.st_mtime_ns)
    assert mirror.read_bytes() == payload == out.read_bytes()
    # The output is a result of this run: the umask's mode (as every atomic write) and a fresh mtime,
    # so Snakemake never takes it for older than its inputs.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask
    assert out.stat().st_mtime_ns > before.st_mtime_ns


def test_damaged_mirror_falls_through_to_the_next_source(server, payload, tmp_path):
    mirror = tmp_path / "mirror.tar.gz"
    mirror.write_bytes(payload[:-10] + b"0123456789")
    out = tmp_path / "data" / NAME

    fetch([str(mirror), server.url()], out, _expected(payload), **FAST)

    assert out.read_bytes() == payload
    assert len(server.requests) == 1
    assert _leftovers(out.parent) == [NAME]


def test_all_sources_failing_gives_one_error_naming_each(server, payload, tmp_path):
    sources = [
        str(tmp_path / "nowhere" / NAME),
        _closed_port_url(),
        server.url("missing.tar.gz"),
        "ftp://example.org/cifar.tar.gz",
    ]
    out = tmp_path / "data" / NAME

    with pytest.raises(AllSourcesFailed) as caught:
        fetch(sources, out, _expected(payload), **FAST)

    message = str(caught.value)
    assert message.startswith(f"could not fetch {NAME} from any of 4 source(s): ")
    assert [source for source, _ in caught.value.failures] == sources
    for source, reason in zip(
        sources, ("no such file", "refused", "HTTP 404", "unsupported source"), strict=True
    ):
        assert re.search(f"{re.escape(source)}: [^;]*{reason}", message, re.IGNORECASE), (source, message)
    assert "gave up after 3 attempt(s)" in message  # the closed port was retried
    assert [request.path for request in server.requests] == ["/missing.tar.gz"]  # a 404 is not retried
    assert not out.exists() and not fetching.part_path(out).exists()


def test_verified_existing_output_is_kept(server, payload, tmp_path):
    out = tmp_path / NAME
    out.write_bytes(payload)
    fetch([_closed_port_url()], out, _expected(payload), **FAST)
    assert out.read_bytes() == payload and server.requests == []


def test_expected_rejects_malformed_digests():
    with pytest.raises(ValueError, match="md5 must be 32 hex digits"):
        Expected(md5="xyz")
    assert Expected(sha256="AB" * 32).sha256 == "ab" * 32


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scalestudy.data.fetch", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_command_line_failure_is_one_clear_line(tmp_path):
    out = tmp_path / NAME
    result = _cli("--source", "cifar10", "--out", str(out), "--url", _closed_port_url(), "--retries", "0")
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"fetch: error: could not fetch {NAME} from any of 1 source(s): [1] http://127.0.0.1:"
    )
    assert "Traceback" not in result.stderr
    assert _leftovers(tmp_path) == []

    result = _cli("--source", "cifar10", "--out", str(out), "--md5", "not-hex")
    assert result.returncode == 1
    assert result.stderr.strip() == "fetch: error: md5 must be 32 hex digits, got 'not-hex'"


def test_command_line_writes_and_pins_a_synthetic_archive(tmp_path):
    sizes = ("--train-per-class", "2", "--test-per-class", "1", "--seed", "3")
    first = tmp_path / "first.tar.gz"
    assert _cli("--source", "synthetic", "--out", str(first), *sizes).returncode == 0
    digest = hashlib.sha256(first.read_bytes()).hexdigest()

    pinned = _cli(
        "--source", "synthetic", "--out", str(tmp_path / "pinned.tar.gz"), "--sha256", digest, *sizes
    )
    assert pinned.returncode == 0, pinned.stderr
    wrong = _cli(
        "--source", "synthetic", "--out", str(tmp_path / "wrong.tar.gz"), "--sha256", "1" * 64, *sizes
    )
    assert wrong.returncode == 1
    assert f"expected {'1' * 64}, got {digest}" in wrong.stderr
    assert _leftovers(tmp_path) == ["first.tar.gz", "pinned.tar.gz"]


# --------------------------------------------------------------------------- a private mirror's login
USER, PASSWORD = "alice", "s3cret-CANARY-netrc"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _netrc(path: Path, host: str = "127.0.0.1", password: str = PASSWORD, mode: int = 0o600) -> Path:
    path.write_text(f"machine {host}\n  login {USER}\n  password {password}\n")
    path.chmod(mode)
    return path


@pytest.fixture
def private(server, monkeypatch, tmp_path) -> FileServer:
    """The test server as a private mirror (HTTP basic, alice's login); no netrc file, no variable."""
    server.login = _basic(USER, PASSWORD)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NETRC", raising=False)
    return server


@pytest.mark.parametrize("where", ["NETRC", "home"])
def test_a_private_mirror_authenticates_from_the_netrc_file(
    private, payload, tmp_path, monkeypatch, caplog, where
):
    if where == "NETRC":
        monkeypatch.setenv("NETRC", str(_netrc(tmp_path / "credentials")))
    else:
        (tmp_path / "home").mkdir()
        _netrc(tmp_path / "home" / ".netrc")
    private.hang_up_after = [len(payload) // 2]  # the resumed request carries the login too
    caplog.set_level("INFO", logger="scalestudy")
    out = tmp_path / NAME

    fetch([private.url()], out, _expected(payload), **FAST)

    assert out.read_bytes() == payload
    assert [(r.status, r.authorization) for r in private.requests] == [
        (200, private.login),
        (206, private.login),
    ]
    assert any("credentials for 127.0.0.1" in message and "netrc" in message for message in caplog.messages)
    assert PASSWORD not in caplog.text and private.login not in caplog.text


def test_the_environment_variables_login_goes_only_to_a_source_that_asks_for_one(
    private, payload, tmp_path, monkeypatch
):
    """data.credentials_env: sent after a 401, never to a source that asks for none (a public one)."""
    monkeypatch.setenv("MIRROR_LOGIN", f"{USER}:{PASSWORD}")
    with serving({NAME: payload}) as public:
        fetch(
            [public.url()],
            tmp_path / "public" / NAME,
            _expected(payload),
            credentials_env="MIRROR_LOGIN",
            **FAST,
        )
    assert [(r.status, r.authorization) for r in public.requests] == [(200, None)]

    fetch([private.url()], tmp_path / NAME, _expected(payload), credentials_env="MIRROR_LOGIN", **FAST)
    assert [(r.status, r.authorization) for r in private.requests] == [(401, None), (200, private.login)]
    assert (tmp_path / NAME).read_bytes() == payload


def test_a_token_in_the_environment_is_sent_as_a_bearer_token(private, payload, tmp_path, monkeypatch):
    private.login = "Bearer hf_CANARYtoken"
    monkeypatch.setenv("HF_TOKEN", "hf_CANARYtoken")
    fetch([private.url()], tmp_path / NAME, _expected(payload), credentials_env="HF_TOKEN", **FAST)
    assert [r.status for r in private.requests] == [401, 200]


@pytest.mark.parametrize(
    ("setup", "status", "said"),
    [
        ("none", 401, "no credentials were sent"),
        ("wrong netrc", 401, "it refused the credentials of the netrc file"),
        (
            "unset variable",
            401,
            "no credentials were sent (data.credentials_env names $MIRROR_LOGIN, which is not set",
        ),
        ("netrc", 403, "it refused the credentials of the netrc file"),
    ],
)
def test_a_refused_login_is_one_line_naming_the_mirror_and_never_the_secret(
    private, payload, tmp_path, monkeypatch, setup, status, said
):
    if setup in ("wrong netrc", "netrc"):
        wrong = PASSWORD if setup == "netrc" else "wrong-CANARY-password"
        monkeypatch.setenv("NETRC", str(_netrc(tmp_path / "credentials", password=wrong)))
    private.forbidden = status == 403
    out = tmp_path / "data" / NAME
    result = _cli("--source", "cifar10", "--out", str(out), "--url", private.url(), "--md5", "0" * 32,
                  "--retries", "0", "--credentials-env", "MIRROR_LOGIN")  # fmt: skip

    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    reason = {401: "Unauthorized", 403: "Forbidden"}[status]
    assert f"HTTP {status} {reason} from 127.0.0.1:{private.port}/{NAME}: {said}" in last, last
    assert "~/.netrc" in last and "data.credentials_env" in last  # what to do
    assert "CANARY" not in result.stderr + result.stdout
    assert len(private.requests) == 1 and not out.exists()  # refused: not retried


def test_a_netrc_file_others_may_read_is_refused_naming_it(private, payload, tmp_path, monkeypatch):
    netrc_file = _netrc(tmp_path / "credentials", mode=0o644)
    monkeypatch.setenv("NETRC", str(netrc_file))
    with pytest.raises(
        AllSourcesFailed, match=rf"netrc file {re.escape(str(netrc_file))}: others may read it"
    ):
        fetch([private.url()], tmp_path / NAME, _expected(payload), **FAST)
    assert private.requests == []
    netrc_file.write_text(f"{USER} {PASSWORD}\n")  # Python's parser quotes a bad token in its message
    netrc_file.chmod(0o600)
    with pytest.raises(AllSourcesFailed, match="line 1: not netrc syntax") as caught:
        fetch([private.url()], tmp_path / NAME, _expected(payload), **FAST)
    assert USER not in str(caught.value) and PASSWORD not in str(caught.value)


def test_a_source_holding_credentials_is_refused_without_printing_them(server, payload, tmp_path):
    """The fetch command line is the rule's, which Snakemake records: a URL's login is refused."""
    sources = [
        f"http://{USER}:{PASSWORD}@127.0.0.1:{server.port}/{NAME}",
        f"{server.url()}?X-Amz-Signature=sig-CANARY&X-Amz-Credential=cred-CANARY",
    ]
    result = _cli(
        "--source", "cifar10", "--out", str(tmp_path / NAME), "--mirror", sources[0], "--url", sources[1]
    )

    assert result.returncode == 1 and server.requests == []
    last = result.stderr.strip().splitlines()[-1]
    assert (
        f"[1] http://***@127.0.0.1:{server.port}/{NAME}: the source holds credentials (user:password@" in last
    )
    assert (
        "X-Amz-Signature=***&X-Amz-Credential=***: the source holds credentials (the query parameter" in last
    )
    assert "CANARY" not in result.stderr + result.stdout


def test_the_login_is_not_carried_across_a_redirect_to_another_host(private, payload, tmp_path, monkeypatch):
    monkeypatch.setenv("NETRC", str(_netrc(tmp_path / "credentials")))
    with serving({NAME: payload}) as elsewhere:
        private.redirect_to = f"http://localhost:{elsewhere.port}/{NAME}"
        fetch([private.url()], tmp_path / NAME, _expected(payload), **FAST)
    assert [(r.status, r.authorization) for r in private.requests] == [(302, private.login)]
    assert [(r.status, r.authorization) for r in elsewhere.requests] == [(200, None)]
