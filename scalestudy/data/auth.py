"""Credentials for fetch's HTTP(S) downloads, from where the study's records never see them.

The config refuses credentials (scalestudy.plan.credentials): a private mirror's login comes from

- ~/.netrc, or the file $NETRC names (curl's variable): `machine <host> login <user> password
  <secret>`, looked up by the source's host and sent with every request to that host (as curl
  --netrc does). The file must be readable by its owner alone (mode 600);
- or an environment variable the config names (data.credentials_env holds its NAME, never the
  secret): `user:password` (HTTP basic) or a token without a colon (sent as `Bearer <token>`). It
  may suit any source, so it is sent only to one that asks for credentials (a 401 answer to a
  request without them): a public source (the official CIFAR-10 URL) never sees it.

The Authorization header is never carried across a redirect (urllib's unredirected header), and
nothing here logs or raises a secret: messages name the host and path, the file or the variable.
Standard library only.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import netrc
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger("scalestudy.data.fetch")

HINT = (
    "give the login in ~/.netrc (or the file $NETRC names; mode 600): `machine <host> login <user>"
    " password <secret>`, or name an environment variable holding <user>:<password> or a token in"
    " data.credentials_env (fetch --credentials-env)"
)


class AuthError(Exception):
    """Credentials that cannot be read (a netrc file others may read, or not netrc syntax)."""


@dataclass(frozen=True)
class Login:
    """One source's credentials and where they came from (for messages: never the secret)."""

    header: str = field(repr=False)
    origin: str


def netrc_path() -> Path:
    """The netrc file fetch reads: $NETRC, else ~/.netrc."""
    return Path(os.environ.get("NETRC") or Path.home() / ".netrc")


def from_netrc(host: str) -> Login | None:
    """The netrc file's login for `host` (its `default` entry if none names the host), or None
    when the file or an entry is missing. AuthError for a file others may read or that is not
    netrc syntax (the message never quotes the file's text: a token in it may be the secret)."""
    path = netrc_path()
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as error:
        raise AuthError(f"netrc file {path}: cannot be read: {error.strerror or error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(
            f"netrc file {path}: others may read it (mode {stat.S_IMODE(mode):o}): chmod 600 {path}"
        )
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except netrc.NetrcParseError as error:
        raise AuthError(f"netrc file {path}: line {error.lineno}: not netrc syntax") from None
    except OSError as error:
        raise AuthError(f"netrc file {path}: cannot be read: {error.strerror or error}") from None
    if entry is None:
        return None
    login, _, password = entry
    return Login(_basic(login or "", password or ""), f"the netrc file {path}")


def from_environment(name: str | None) -> Login | None:
    """The login the variable `name` holds (data.credentials_env), or None when none is named or
    it is unset or empty."""
    value = os.environ.get(name) if name else None
    if not value:
        return None
    user, colon, password = value.partition(":")
    header = _basic(user, password) if colon else f"Bearer {value}"
    return Login(header, f"${name} (data.credentials_env)")


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def where(url: str) -> str:
    """A source as messages name it: host[:port]/path, without user information or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{host}:{parts.port}{parts.path}" if parts.port else f"{host}{parts.path}"


@dataclass
class SourceAuth:
    """The credentials of one download source, across its requests (retries, resumes): the netrc
    file's login for its host from the first request; the environment's once the source has
    answered 401 to a request without it."""

    url: str
    env: str | None = None
    challenged: bool = False
    _netrc: Login | None = field(default=None, init=False, repr=False)
    _netrc_read: bool = field(default=False, init=False, repr=False)
    _warned: bool = field(default=False, init=False, repr=False)

    def login(self) -> Login | None:
        """The credentials to send with the next request, or None."""
        if not self._netrc_read:
            self._netrc = from_netrc(urlsplit(self.url).hostname or "")
            self._netrc_read = True
            if self._netrc is not None:
                log.info("credentials for %s: from %s", where(self.url), self._netrc.origin)
        if self._netrc is not None:
            return self._sent(self._netrc)
        if self.challenged:
            return self._sent(from_environment(self.env))
        return None

    def answer_challenge(self) -> bool:
        """After a 401: whether a request with the environment's credentials is worth making (they
        exist and were not sent yet)."""
        if self.challenged or self._netrc is not None or from_environment(self.env) is None:
            return False
        self.challenged = True
        log.info("%s asks for credentials: sending those of %s", where(self.url), f"${self.env}")
        return True

    def refused(self, code: int, reason: str) -> str:
        """The one-line message of a 401 or 403 answer: the source, what was sent, what to do."""
        sent = self.login()
        if sent is not None:
            what = f"it refused the credentials of {sent.origin}"
        elif self.env and not os.environ.get(self.env):
            what = f"no credentials were sent (data.credentials_env names ${self.env}, which is not set here)"
        else:
            what = "no credentials were sent"
        return f"HTTP {code} {reason} from {where(self.url)}: {what}; {HINT}"

    def _sent(self, login: Login | None) -> Login | None:
        plain = urlsplit(self.url).scheme == "http" and not _loopback(self.url)
        if login is not None and plain and not self._warned:
            self._warned = True
            log.warning(
                "%s is plain http: the credentials of %s cross the network readable (use https)",
                where(self.url),
                login.origin,
            )
        return login


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
