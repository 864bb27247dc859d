"""pip's index settings as uv's arguments, one per line, for scripts/bootstrap.sh.

uv reads no pip configuration, and a site's mirror, wheel folder or constraints file live there
(pip.conf, PIP_* variables). This asks pip for its effective settings (`pip config list`) and prints
the uv arguments that give uv the same view, e.g. `--extra-index-url` then its URL on the next
line. The certificate pip trusts is printed as `SSL_CERT_FILE=<path>` (uv reads it from the
environment). Standard library only: it runs before the environment it helps to build exists; it
lives here, not in the scalestudy package, for that reason.

    python scripts/uv_index_args.py [PYTHON_WITH_PIP]
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's own precedence: the environment over a command's section over [global].
SECTION_RANK = {"global": 0, "install": 1, ":env:": 2}
# pip option -> uv option; a list-valued pip option gives one uv option per item.
LIST_OPTIONS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}


def effective_settings(listing: str) -> dict[str, str]:
    """`pip config list` output -> {option: value}, the highest-precedence section winning."""
    chosen: dict[str, tuple[int, str]] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        section, dot, option = key.rpartition(".")
        if not sep or not dot or section not in SECTION_RANK:
            continue
        rank = SECTION_RANK[section]
        if option not in chosen or rank >= chosen[option][0]:
            chosen[option] = (rank, ast.literal_eval(raw))
    return {option: value for option, (_, value) in chosen.items()}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    """The uv command-line arguments (and SSL_CERT_FILE=...) equivalent to pip's settings."""
    arguments: list[str] = []
    if "index-url" in settings:
        arguments += ["--index-url", settings["index-url"]]
    for option, uv_option in LIST_OPTIONS.items():
        for value in settings.get(option, "").split():
            arguments += [uv_option, value]
    if settings.get("no-index", "").lower() in {"1", "true", "yes", "on"}:
        arguments.append("--no-index")
    if "cert" in settings:
        arguments.append(f"SSL_CERT_FILE={settings['cert']}")
    return arguments


def main(argv: list[str]) -> int:
    python = argv[0] if argv else sys.executable
    listing = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    print("\n".join(uv_arguments(effective_settings(listing))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
