"""What the package's command lines share: their name in --help, and JSON given in a file.

Standard library only: the Snakefile's rules import it (json_file) when the workflow is parsed.

* `parser(__doc__)`: an argument parser named as the program is run, `program()`: "python -m
  scalestudy.crate" in its usage line (argparse's own default is the file's name: "__main__.py",
  "metrics.py"), described by the docstring's first line;
* `json_file(value, name)`: a rule's JSON parameter as "@FILE" (a file named by its content, under
  JSON_DIR), so that a command line stays short (the crate's whole config is 18 kB) and a changed
  value is still a changed parameter (a new name) for Snakemake's rerun triggers;
* `json_argument(text, option)`: an option's JSON from "@FILE" or inline text, a bad one named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

JSON_DIR = ".snakemake/scalestudy/json"  # beside Snakemake's own records, in the workflow folder


def parser(doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """An argument parser named `program()`, described by `doc`'s first line."""
    description = (doc or "").strip().splitlines()[0] if (doc or "").strip() else None
    return argparse.ArgumentParser(prog=program(), description=description, **kwargs)


def program(spec: Any = None) -> str | None:
    """`python -m <module>` of a module's __spec__ (default: the running program's); None where the
    module is not the package's (argparse then names the file)."""
    if spec is None:
        main: ModuleType | None = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
    name = str(getattr(spec, "name", "") or "").removesuffix(".__main__")
    return f"python -m {name}" if name.split(".")[0] == "scalestudy" else None


def json_file(value: Any, name: str, folder: str | os.PathLike = JSON_DIR) -> str:
    """ "@<folder>/<name>-<sha256 of the JSON>.json", the file written (atomically) where missing."""
    text = json.dumps(value, sort_keys=True, default=str, indent=1) + "\n"
    path = Path(folder) / f"{name}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    return f"@{path}"


def json_argument(text: str, option: str) -> Any:
    """The JSON an option holds: inline, or in the file "@FILE" names. ValueError naming the option
    (and the file) where it cannot be read."""
    source = ""
    if text.startswith("@"):
        source = f" ({text[1:]})"
        try:
            text = Path(text[1:]).read_text()
        except OSError as error:
            raise ValueError(f"{option}: {text[1:]}: {error.strerror or error}") from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise ValueError(f"{option}{source}: not JSON ({error})") from None
