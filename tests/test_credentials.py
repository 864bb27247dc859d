"""Credentials never enter the study's records (issue 55; docs/reference/robustness.md, "Credentials").

A config value holding one (a URL's user:password@, a secret-looking query parameter) is refused
before planning, in one line naming each key and never the value: at every string key the schema
walk finds (tests/hostile_helpers.py), at keys it does not know, in the config files' comments, by
Snakemake itself (exit 2, nothing written) whether the config comes from --configfile or --config.
MLflow's own variables reach the follower and rule `track` (a stub server records what they send).
The canary scan of a whole demo run is tests/test_workflow.py's
(test_no_secret_reaches_any_file_of_the_study_or_its_console).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from scalestudy import tracking
from scalestudy.plan import configcheck, credentials, studyconfig
from tests.conftest import REPO, copy_workflow, snakemake_env
from tests.documented_commands import documented_commands
from tests.file_server import http_server
from tests.hostile_helpers import SCHEMA, STRING_SLOTS, filled_demo, names_key, put, slot_id

CANARY = "CANARYpw7f3k9q"
# Each way a credential rides in a URL, and the words the refusal uses for it.
SECRET_URLS = {
    "user and password": (f"https://alice:{CANARY}@mirror.example.org/c.tar.gz", "user:password@ in a URL"),
    "a token as the user": (f"https://{CANARY}@git.example.org/c.tar.gz", "user:password@ in a URL"),
    "S3 presigned": (
        f"https://b.s3.example.com/c.tar.gz?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA{CANARY}"
        f"&X-Amz-Signature={CANARY}",
        "the query parameter X-Amz-Credential",
    ),
    "token=": (f"https://example.org/get?file=c.tar.gz&token={CANARY}", "the query parameter token"),
    "Azure SAS": (f"https://a.blob.example.net/c/c.tar.gz?sv=2022-11-02&sp=r&sig={CANARY}", "parameter sig"),
    "key=": (f"https://example.org/c.tar.gz?key={CANARY}", "the query parameter key"),
    "password= after ;": (f"https://example.org/c?a=1;password={CANARY}", "the query parameter password"),
    "OAuth fragment": (f"https://example.org/c#access_token={CANARY}", "the query parameter access_token"),
    "a URL inside a query": (
        f"https://example.org/login?next={quote(f'https://u:{CANARY}@g.example.org/')}",
        "user:password@ in a URL",
    ),
    "inside an option": (f"--comment=postgresql://mlflow:{CANARY}@dbhost/mlflow", "user:password@ in a URL"),
}
NOT_SECRET = [
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "https://example.org/get?file=cifar-10-python.tar.gz&part=a;b",
    "https://example.org/get?tokenizer=gpt2&keyword=fast&monkey=1",
    "https://example.org/models/v2@latest/c.tar.gz",
    "file:///datasets/cifar-10-python.tar.gz",
    "s3://bucket/key/c.tar.gz",
    "--mail-user=alice@example.org",
    "/shared/datasets/cifar-10-python.tar.gz",
]


def assert_refused_without_the_secret(message: str | None, *named: str) -> None:
    assert message is not None and message.startswith("invalid config: credentials in "), message
    assert CANARY not in message and "\n" not in message, message
    assert "~/.netrc" in message and "MLFLOW_TRACKING_PASSWORD" in message  # where they go instead
    for text in named:
        assert text in message, (text, message)


# --------------------------------------------------------------------------- the check


def test_every_string_key_of_the_schema_refuses_a_url_with_a_login_naming_the_key():
    """The schema walk's string keys (values, list items, map keys and values): each named, never
    the secret; configcheck.check (studyconfig.load, the Slurm preview) refuses it first and alone,
    before the checks whose messages quote values (a pattern's)."""
    url = SECRET_URLS["user and password"][0]
    base = filled_demo()
    assert len(STRING_SLOTS) > 40
    for slot in STRING_SLOTS:
        config = json.loads(json.dumps(base))
        concrete = put(config, slot, url)
        message = credentials.refusal(config)
        assert_refused_without_the_secret(message)
        assert names_key(message, concrete, slot), (slot_id(slot), message)
        with pytest.raises(configcheck.ConfigError) as caught:
            configcheck.check(config, SCHEMA)
        assert str(caught.value) == message


@pytest.mark.parametrize("kind", SECRET_URLS)
def test_each_way_a_url_carries_a_credential_is_refused(kind):
    url, said = SECRET_URLS[kind]
    config = filled_demo()
    config["data"]["mirrors"] = ["/shared/c.tar.gz", url]
    assert_refused_without_the_secret(credentials.refusal(config), "data.mirrors[1] (", said)


def test_keys_the_schema_does_not_know_and_nested_values_are_walked():
    """A --config extra or a misspelt key: the check runs before the schema refuses it."""
    url = SECRET_URLS["token="][0]
    config = {"data": {"url": "https://example.org/c.tar.gz"}, "extra": {"deep": [{"list": [1, url]}]}}
    config[f"https://u:{CANARY}@h.example.org/"] = 1  # a key
    message = credentials.refusal(config)
    assert_refused_without_the_secret(message, "extra.deep[0].list[1] (the query parameter token)")
    assert "(top level) (a key of it: a URL with credentials)" in message


def test_a_login_where_the_name_of_its_variable_belongs_is_refused_unquoted():
    config = filled_demo()
    config["data"]["credentials_env"] = f"alice:{CANARY}"
    assert_refused_without_the_secret(credentials.refusal(config), "data.credentials_env (not the name of")
    config["data"]["credentials_env"] = "MIRROR_LOGIN"
    assert credentials.refusal(config) is None


@pytest.mark.parametrize("value", NOT_SECRET)
def test_urls_and_values_without_credentials_pass(value):
    config = filled_demo()
    config["data"]["mirrors"] = [value]
    config["cluster"]["sbatch_extra"] = [value]
    assert credentials.refusal(config) is None


def test_the_projects_own_configs_and_profiles_hold_none():
    files = sorted([*REPO.glob("config/*.yaml"), *REPO.glob("profiles/*/config.yaml")])
    assert len(files) >= 6
    for path in files:
        assert credentials.refusal(yaml.safe_load(path.read_text()), [path]) is None, path


def test_a_study_config_file_is_refused_before_the_schema_can_quote_the_value(tmp_path):
    """container.sif has a pattern: the schema's message would print the URL whole."""
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    config["container"] = {"sif": SECRET_URLS["user and password"][0]}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(configcheck.ConfigError) as caught:
        studyconfig.load(path)
    assert_refused_without_the_secret(str(caught.value), "container.sif (user:password@ in a URL)")

    del config["container"]
    path.write_text(yaml.safe_dump(config) + f"# old mirror: {SECRET_URLS['token='][0]}\n")
    with pytest.raises(configcheck.ConfigError) as caught:
        studyconfig.load(path)  # a comment: the crate carries the file as written
    line = len(path.read_text().splitlines())
    assert_refused_without_the_secret(str(caught.value), f"{path}:{line} (the query parameter token)")


def test_redact_hides_every_credential_and_keeps_the_rest():
    text = " ".join(url for url, _ in SECRET_URLS.values())
    redacted = credentials.redact(text)
    assert CANARY not in redacted
    assert "https://***@mirror.example.org/c.tar.gz" in redacted
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***&X-Amz-Signature=***" in redacted
    assert "sv=2022-11-02&sp=r&sig=***" in redacted and "login?next=***" in redacted
    assert credentials.redact(" ".join(NOT_SECRET)) == " ".join(NOT_SECRET)


# --------------------------------------------------------------------------- Snakemake itself


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("credentials") / "workflow")


def refused_by_snakemake(workdir: Path, *args: str) -> str:
    """Snakemake's output for `args`, which must stop before planning: exit 2, one line of ours
    after the profile's, no canary on the console or in any file Snakemake wrote."""
    command = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", "--cores", "1", *args]
    result = subprocess.run(
        command, cwd=workdir, env=snakemake_env(), capture_output=True, text=True, timeout=300
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert CANARY not in output, output
    lines = [line for line in output.splitlines() if not line.startswith(("Using profile", "Config file "))]
    assert len(lines) == 1, output
    assert not (workdir / "results").exists()
    written = [path for path in (workdir / ".snakemake").rglob("*") if path.is_file()]
    assert not [path for path in written if CANARY.encode() in path.read_bytes()]
    return lines[0]


def test_snakemake_refuses_a_config_file_holding_credentials_in_one_line(workflow):
    config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
    config["data"]["mirrors"] = [SECRET_URLS["user and password"][0], SECRET_URLS["S3 presigned"][0]]
    config["tracking"] = {"uri": f"http://alice:{CANARY}@login01:5000"}
    (workflow / "config/canary.yaml").write_text(yaml.safe_dump(config))
    line = refused_by_snakemake(workflow, "--configfile", "config/canary.yaml")
    for named in ("data.mirrors[0] (user:password@", "data.mirrors[1] (the query parameter X-Amz-Signature",
                  "tracking.uri (user:password@"):  # fmt: skip
        assert named in line, line


def test_snakemake_refuses_credentials_given_with_config_on_the_command_line(workflow):
    """--config reaches the crate's config.json and Snakemake's metadata as surely as a file."""
    value = json.dumps({"mirrors": [SECRET_URLS["token="][0]]})
    line = refused_by_snakemake(workflow, "--config", f"data={value}")
    assert "data.mirrors[0] (the query parameter token)" in line, line


def test_snakemake_refuses_a_credential_in_a_config_files_comment(workflow):
    """The crate carries the config files as written, comments included."""
    text = (REPO / "config/demo.yaml").read_text() + f"# mirror: {SECRET_URLS['user and password'][0]}\n"
    (workflow / "config/commented.yaml").write_text(text)
    line = refused_by_snakemake(workflow, "--configfile", "config/commented.yaml")
    assert f"config/commented.yaml:{len(text.splitlines())} (user:password@ in a URL)" in line, line


def test_the_fetch_rule_logs_in_to_a_private_mirror_with_the_variable_the_config_names(tmp_path):
    """data.credentials_env through the workflow: the rule hands fetch the variable's name, fetch
    the login to the mirror that asks (HTTP basic); neither the log, Snakemake's records nor the
    console hold it."""
    from scalestudy.data import synthetic_cifar
    from tests.file_server import NAME, serving

    archive = tmp_path / NAME
    synthetic_cifar.write_archive(archive, train_per_class=2, test_per_class=1, seed=0)
    payload = archive.read_bytes()
    workdir = copy_workflow(tmp_path / "workflow")
    env = {key: value for key, value in snakemake_env().items() if not key.lower().endswith("_proxy")}
    env["MIRROR_LOGIN"] = f"alice:{CANARY}"
    with serving({NAME: payload}) as mirror:
        mirror.login = "Basic " + base64.b64encode(f"alice:{CANARY}".encode()).decode()
        config = yaml.safe_load((REPO / "config/demo.yaml").read_text())
        config["data"] = {"source": "cifar10", "mirrors": [mirror.url()], "credentials_env": "MIRROR_LOGIN",
                          "md5": hashlib.md5(payload).hexdigest(), "size_bytes": len(payload)}  # fmt: skip
        (workdir / "config/private.yaml").write_text(yaml.safe_dump(config))
        target = f"results/data/{NAME}"
        command = [sys.executable, "-m", "snakemake", target, "--profile", "profiles/local", "--cores", "1"]
        command += ["--configfile", "config/private.yaml", "--printshellcmds"]
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert (workdir / target).read_bytes() == payload
    assert [(r.status, r.authorization) for r in mirror.requests] == [(401, None), (200, mirror.login)]
    assert "--credentials-env MIRROR_LOGIN" in output  # the name only, on the command line
    assert CANARY not in output
    written = [p for root in ("results", ".snakemake") for p in (workdir / root).rglob("*") if p.is_file()]
    assert not [path for path in written if CANARY.encode() in path.read_bytes()]


# --------------------------------------------------------------------------- MLflow's own variables


class _Recorder(BaseHTTPRequestHandler):
    """An MLflow server that refuses every request (401) and records its Authorization header."""

    def _refuse(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        body = json.dumps({"error_code": "UNAUTHENTICATED", "message": "login required"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def mlflow_stub():
    with http_server(_Recorder) as server:
        server.seen = []  # type: ignore[attr-defined]
        yield server


def _settings(server, tmp_path: Path) -> dict:
    config = {
        "study": {"name": "canary"},
        "tracking": {"uri": f"http://127.0.0.1:{server.server_address[1]}"},
    }
    return tracking.settings(config, tmp_path)


def test_rule_tracks_sync_logs_in_with_mlflows_variables_and_never_prints_them(mlflow_stub, tmp_path):
    env = {**snakemake_env(), "MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": CANARY}
    env.pop("MLFLOW_TRACKING_TOKEN", None)
    settings = json.dumps(_settings(mlflow_stub, tmp_path))
    (tmp_path / "runs").mkdir()
    command = [sys.executable, "-m", "scalestudy.tracking", "sync", "--tracking-json", settings]
    command += ["--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "sync.json")]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]  # the stub refuses: the store cannot be used
    expected = "Basic " + base64.b64encode(f"alice:{CANARY}".encode()).decode()
    assert mlflow_stub.seen and set(mlflow_stub.seen) == {expected}
    assert "UNAUTHENTICATED: login required" in result.stderr  # the refusal reached the log
    assert CANARY not in result.stdout + result.stderr
    assert expected.split()[1] not in result.stdout + result.stderr


def test_the_follower_inherits_mlflows_token_variable(mlflow_stub, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", CANARY)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    logs = tmp_path / "logs"
    pid = tracking.start_follower(_settings(mlflow_stub, tmp_path), logs, [tmp_path / "runs"], [])
    assert pid is not None
    try:
        deadline = time.monotonic() + 240  # it attaches 10 s after its start (no journal appears)
        while not mlflow_stub.seen and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        tracking.stop_follower(logs / tracking.FOLLOWER_PID)
    assert mlflow_stub.seen and set(mlflow_stub.seen) == {f"Bearer {CANARY}"}
    log = (logs / tracking.FOLLOWER_LOG).read_text()
    assert "UNAUTHENTICATED" in log, log[-2000:]
    assert CANARY not in log


# --------------------------------------------------------------------------- the documented server


def server_commands() -> list[tuple[str, str]]:
    """(file:line, command) of every `mlflow server` or `mlflow ui` the docs show."""
    return [
        (command.where, command.text)
        for command in documented_commands()
        if re.search(r"(^|\s)mlflow (server|ui)(\s|$)", command.text)
    ]


def test_the_docs_never_show_an_unauthenticated_tracking_server_on_every_interface():
    """A server is bound to 127.0.0.1 (MLflow's default, or said) or runs MLflow's basic-auth app."""
    commands = server_commands()
    assert any("mlflow server" in text for _, text in commands), commands
    assert any("--app-name basic-auth" in text for _, text in commands), commands
    for where, text in commands:
        host = re.search(r"(?:--host|-h)[ =](\S+)", text)
        loopback = host is None or host.group(1) in ("127.0.0.1", "localhost", "::1")
        assert loopback or "--app-name basic-auth" in text, f"{where}: {text}"
    page = (REPO / "docs/guide/tracking.md").read_text()
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        assert name in page
