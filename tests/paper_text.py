"""The paper's text as its reader meets it, without TeX: the template's body with every number macro
of numbers.tex replaced by its value and every \\input table inlined. The tests read it for claims
(no Slurm in a study Slurm did not run) and for broken English where a macro is "not measured"."""

from __future__ import annotations

import re
from pathlib import Path

_DEFINITION = re.compile(r"^\\newcommand\{\\([A-Za-z]+)\}\{(.*)\}%", re.M)


def macro_values(numbers_tex: str) -> dict[str, str]:
    """{name: value} of a numbers.tex (scalestudy.paper.macros.Numbers.render: one macro a line)."""
    return dict(_DEFINITION.findall(numbers_tex))


def expanded(template: str, values: dict[str, str], folder: Path | None = None) -> str:
    """The document body, its macros replaced by their values (`\\Name{}` and `\\Name`) and, with
    `folder`, each `\\input{file}` beside it replaced by the file's own text."""
    body = template[template.index(r"\begin{document}") : template.index(r"\end{document}")]
    body = re.sub(r"(?<!\\)%.*$", "", body, flags=re.M)  # comments, not \\%
    if folder is not None:
        body = re.sub(
            r"\\input\{([^}]+)\}",
            lambda m: (folder / m.group(1)).read_text() if (folder / m.group(1)).is_file() else m.group(0),
            body,
        )
    names = sorted(values, key=len, reverse=True)  # \StrongEffAtLargest before \StrongEff
    pattern = re.compile(r"\\(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z])(\{\})?")
    text = pattern.sub(lambda m: values[m.group(1)], body)
    # a macro that is \iftrue or \iffalse keeps what TeX keeps of `... \else ... \fi` (not nested)
    branches = re.compile(
        r"\\if(true|false)(?![A-Za-z])(.*?)(?:\\else(?![A-Za-z])(.*?))?\\fi(?![A-Za-z])", re.S
    )
    return branches.sub(lambda m: m.group(2) if m.group(1) == "true" else (m.group(3) or ""), text)


def sentences(text: str) -> list[str]:
    """The text's sentences, whitespace joined (a rough split at '. ')."""
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s.strip()]


# what a report embeds as data (figures, tables): left out of its words
_EMBEDDED = re.compile(r"data:[\w/+.-]*;base64,[A-Za-z0-9+/=]+")


def paper_and_report(workdir: Path) -> tuple[str, str]:
    """The words of a study's paper (paper.tex with numbers.tex and its tables) and of its report
    (report.html without the data it embeds)."""
    folder = workdir / "results/paper"
    values = macro_values((folder / "numbers.tex").read_text())
    paper = expanded((folder / "paper.tex").read_text(), values, folder)
    report = _EMBEDDED.sub("", (workdir / "results/report.html").read_text(errors="replace"))
    return paper, report


# English that a macro in some state would break
BROKEN = {
    "a verdict said twice": re.compile(r"not measured,? (\\emph\{)?not measured"),
    "a time that is none": re.compile(r"\b(after|in|at) not (reached|measured)\b"),
    "a count that is none": re.compile(r"(^|[.:;] )not measured (were|was|points|matched|showed)\b"),
    "a doubled word": re.compile(r"\b(\w+) \1\b"),
}


def broken(text: str) -> list[str]:
    return [f"{why}: {match.group(0)!r}" for why, rule in BROKEN.items() for match in rule.finditer(text)]
