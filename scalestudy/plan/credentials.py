"""Credentials kept out of the study's records: a config that holds one is refused before planning.

Every config value is recorded: in the crate (config.json, the config files themselves, the zip; a
package for sharing, CC-BY-4.0 by default), in Snakemake's metadata and log, and on the command line
of the jobs that take it (the crate's carries the whole config as JSON, which Snakemake prints).
So a URL that carries a credential -- user information (`https://alice:<token>@mirror/...`) or a
secret-looking query parameter (`token=`, `X-Amz-Signature=`, `sig=`, ...) -- is refused, in one
line naming each key and saying where credentials go instead: ~/.netrc (or $NETRC), which fetch
reads, or environment variables (data.credentials_env names the one fetch reads; MLflow reads its
own). The value itself is never repeated. docs/reference/robustness.md, "Credentials", says why refusing
rather than redacting.

The whole config is walked, not only the keys the schema knows (a `--config` extra, a key the
schema refuses later: this check runs before the schema's, whose messages quote values), every
string searched for URLs anywhere in it (`--comment=https://...` in an sbatch option), and the
config files' text too, comments included (the crate carries the files as written).

`redact` gives a text's URLs with their credentials replaced by `***`, for the messages and logs of
code that is handed a URL outside the config (the fetch command line). Standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from scalestudy.plan import patterns

HIDDEN = "***"
# Where credentials go instead (the refusal's advice; docs/reference/robustness.md).
INSTEAD = (
    "credentials never go into the config, which the crate, Snakemake's metadata and logs and the"
    " jobs' command lines record: put them in ~/.netrc (or the file $NETRC names), which fetch reads"
    " (`machine <host> login <user> password <secret>`, mode 600), or in environment variables:"
    " data.credentials_env names the one fetch reads, MLflow reads MLFLOW_TRACKING_USERNAME and"
    " MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"
)

# The start of a URL: a scheme and "://" (file:///x, https://h/..., s3://b/k, postgresql://u@h/db).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_URL_END = re.compile(r"[\s\"'<>`]")
# Query parameter names that hold a secret: these words in the name (split at - _ . and camelCase),
# or these words run together (AWSAccessKeyId, api_key, Ocp-Apim-Subscription-Key), or exactly "key"
# (Google's API keys).
SECRET_WORDS = frozenset(
    {
        "token", "secret", "password", "passwd", "pwd", "passphrase", "signature", "sig",
        "credential", "credentials", "auth", "authorization", "apikey",
    }
)  # fmt: skip
SECRET_COMPOUNDS = ("apikey", "accesskey", "privatekey", "secretkey", "accountkey", "subscriptionkey")
# Keys that hold the NAME of a variable holding a login: anything else there may be the login itself,
# which the schema's pattern message would quote.
NAME_KEYS = ("credentials_env",)


def urls(text: str) -> Iterator[str]:
    """Every URL in `text`, nested ones too (`https://h/?next=https://u:p@g/`: both)."""
    for match in _SCHEME.finditer(text):
        end = _URL_END.search(text, match.end())
        yield text[match.start() : end.start() if end else len(text)]


def secret_parameter(name: str) -> bool:
    """Whether a query parameter of this name holds a credential (token=, X-Amz-Signature=, sig=)."""
    words = re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).lower())
    joined = "".join(words)
    return (
        joined == "key"
        or any(word in SECRET_WORDS for word in words)
        or any(compound in joined for compound in SECRET_COMPOUNDS)
    )


def _parameters(url: str) -> list[tuple[str, str]]:
    """The query's and the fragment's name=value pairs (OAuth puts #access_token= in the fragment),
    split at & and ; alike."""
    parts = urlsplit(url)
    pieces = re.split(r"[&;]", f"{parts.query}&{parts.fragment}")
    return [(unquote(name), unquote(value)) for name, _, value in (p.partition("=") for p in pieces) if name]


def url_credentials(url: str) -> list[str]:
    """What in `url` is a credential, in words that do not repeat it: "user:password@ in a URL" (user
    information, a user alone included: a token often stands there), "the query parameter
    X-Amz-Signature"; [] for none."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced [ in the host: no URL a client would send
        return []
    found = []
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        found.append("user:password@ in a URL")
    for name, value in _parameters(url):
        if secret_parameter(name):
            found.append(f"the query parameter {name}")
        elif "://" in value:
            found += url_credentials(value)
    return list(dict.fromkeys(found))


def text_credentials(text: str) -> list[str]:
    """What in a text is a credential (url_credentials of every URL in it)."""
    return list(dict.fromkeys(found for url in urls(text) for found in url_credentials(url)))


def config_credentials(value: Any, key: str = "") -> Iterator[str]:
    """`<key> (<what>)` for every value under `value` (a config: mappings, lists, strings; the keys of
    a mapping too) that holds a credential."""
    if isinstance(value, str):
        for found in text_credentials(value):
            yield f"{key or '(top level)'} ({found})"
        if key.rpartition(".")[2] in NAME_KEYS and not re.fullmatch(patterns.ENV_NAME, value):
            yield f"{key} (not the name of an environment variable: the login itself?)"
    elif isinstance(value, dict):
        for name, item in value.items():
            where = f"{key}.{name}" if key else str(name)
            if isinstance(name, str) and text_credentials(name):
                yield f"{key or '(top level)'} (a key of it: a URL with credentials)"
            yield from config_credentials(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from config_credentials(item, f"{key}[{index}]")


def file_credentials(paths: Iterable[str | os.PathLike]) -> Iterator[str]:
    """`<file>:<line> (<what>)` for every line of the config files that holds a credential, comments
    included. A file that cannot be read is left to the config's loader (which names it)."""
    for path in paths:
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            for found in text_credentials(line):
                yield f"{path}:{number} ({found})"


def refusal(config: Any, configfiles: Iterable[str | os.PathLike] = ()) -> str | None:
    """The one-line refusal of a config that holds credentials, naming each key; or of its files'
    lines that do where no value does (a comment, text the config does not keep); else None."""
    found = list(dict.fromkeys(config_credentials(config))) or list(file_credentials(configfiles))
    if not found:
        return None
    return f"invalid config: credentials in {', '.join(found)}: {INSTEAD}"


def redact(text: str) -> str:
    """`text` with the credentials of its URLs replaced by *** (user information, the values of
    secret-looking query parameters); the rest as it was."""
    for url in sorted(set(urls(text)), key=len, reverse=True):
        text = text.replace(url, _redacted_url(url))
    return text


def _redacted_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    host_end = re.search(r"[/?#]", rest)
    netloc, tail = (rest[: host_end.start()], rest[host_end.start() :]) if host_end else (rest, "")
    if "@" in netloc:
        netloc = f"{HIDDEN}@{netloc.rpartition('@')[2]}"
    tail = re.sub(
        r"([?&;#])([^=&;#]*)=([^&;#]*)",
        lambda m: f"{m[1]}{m[2]}={HIDDEN if _hidden(unquote(m[2]), unquote(m[3])) else m[3]}",
        tail,
    )
    return f"{scheme}://{netloc}{tail}"


def _hidden(name: str, value: str) -> bool:
    return secret_parameter(name) or bool(text_credentials(value))
