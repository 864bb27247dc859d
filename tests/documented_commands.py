"""The shell commands README.md and the docs show (PAGES), as a reader would copy them: fenced
```bash/sh/shell blocks (every line; `\\` continues a line), ```console blocks (the `$ ` lines), and
inline `code` that is a whole command (it starts with a program and has arguments; a synopsis with
placeholders, `<x>`, `...`, `A|B` or CAPITALS, a bare program or module name, and a lone VAR=value
are prose, not commands). tests/test_docs_commands.py runs them; tests/test_credentials.py reads the
tracking server's."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO

# The pages a reader follows (the measurement records under docs/measurements/ are logs, not instructions).
PAGES = (
    "README.md",
    "CONTRIBUTING.md",
    "config/README.md",
    "profiles/README.md",
    "docs/*.md",
    "docs/guide/*.md",
    "docs/reference/*.md",
)


@dataclass(frozen=True)
class Command:
    """One documented command: where it is (file:line) and its text (continuations joined)."""

    where: str
    text: str


# --- extraction ----------------------------------------------------------------------------------
FENCE = re.compile(r"^\s*(```+)\s*([\w+-]*)")
# Inline code that starts with one of these (after VAR=value words) may be a command.
PROGRAM_NAMES = (
    "python python3 snakemake bash source sh pytest apptainer nsys ncu sbatch srun squeue torchrun cp"
)
ASSIGNMENT = r"[A-Z_][A-Z0-9_]*=\S*"
PROGRAMS = re.compile(
    rf"^(?:{ASSIGNMENT}\s+)*(?:\.venv/bin/)?(?:{'|'.join(PROGRAM_NAMES.split())}|\$EDITOR)(?:\s|$)"
)
SYNOPSIS = re.compile(r"\.\.\.|<[^>]*>|\||\[|/--|(?<![\w$=./-])[A-Z]+(?![\w=])")


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # outside quotes, after a blank or at the start)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def is_command(span: str) -> bool:
    """Inline code that is a whole command: a program with arguments, not a synopsis or a name."""
    if not PROGRAMS.match(span) or SYNOPSIS.search(span):
        return False
    try:
        words = shlex.split(span)
    except ValueError:  # unbalanced quotes: not a command
        return False
    while words and re.fullmatch(ASSIGNMENT, words[0]):
        words = words[1:]
    module_only = len(words) == 3 and words[1] == "-m"
    return len(words) >= 2 and not module_only


def block_commands(lines: list[tuple[int, str]], console: bool) -> list[tuple[int, str]]:
    """(line number, command) of a fenced block's lines; console blocks: the `$ ` lines only."""
    commands: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in lines:
        line = raw.strip()
        if pending is None:
            if console and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            pending = (number, "")
        text = strip_comment(line)
        if text.endswith("\\"):
            pending = (pending[0], pending[1] + text[:-1].strip() + " ")
            continue
        commands.append((pending[0], " ".join((pending[1] + text).split())))
        pending = None
    return commands


def extract(path: Path, name: str) -> list[Command]:
    """The commands of one Markdown page, in page order, each named `name:line`."""
    found: list[tuple[int, str]] = []
    fence: tuple[str, str, list] | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1) == fence[0] and not opened.group(2):
                if fence[1] in ("bash", "sh", "shell", "console"):
                    found += block_commands(fence[2], console=fence[1] == "console")
                fence = None
            else:
                fence[2].append((number, line))
        elif opened:
            fence = (opened.group(1), opened.group(2), [])
        else:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line) if is_command(span)]
    return [Command(f"{name}:{number}", text) for number, text in sorted(found)]


def documented_commands(root: Path = REPO) -> list[Command]:
    pages = sorted({page for pattern in PAGES for page in root.glob(pattern)})
    return [command for page in pages for command in extract(page, str(page.relative_to(root)))]
