"""results/paper/paper.tex from the template in report/paper/, checked before it is written.

    python -m scalestudy.paper.draft --template report/paper/template.tex \
        --bib report/paper/references.bib --numbers results/paper/numbers.tex --out results/paper/paper.tex

The checks (each failure names the file and line):
  * every macro the template uses that looks like a number macro (an upper-case first letter, not a
    LaTeX command such as \\LaTeX) is defined in numbers.tex or by the template's own \\newcommand;
  * no number is typed by hand: in the document body (\\begin{document} to \\end{document}), after
    removing comments, the arguments of referencing and file commands (REFERENCE_COMMANDS: \\ref,
    \\label, \\cite, \\input, \\includegraphics, \\begin, \\end, ...), \\const{...} (a constant of a
    formula such as the 2 of 2(N-1)/N) and every macro name, no digit 0-9 is left;
  * every \\input and \\includegraphics file exists beside paper.tex.
The bibliography is copied beside paper.tex, so that results/paper/ compiles on its own.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from scalestudy import atomic, commandline
from scalestudy.paper.macros import defined_names
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.paper.draft")

# Commands whose arguments are names, keys or files, not text: digits there are not numbers.
REFERENCE_COMMANDS = (
    "label", "ref", "eqref", "pageref", "autoref", "cite", "citep", "citet", "nocite", "input", "include",
    "includegraphics", "begin", "end", "bibliography", "bibliographystyle", "url", "href", "const",
    "hspace", "vspace",
)  # fmt: skip
# LaTeX's own commands that start with an upper-case letter (the number macros all do).
LATEX_UPPER = frozenset(
    [
        "LaTeX",
        "LaTeXe",
        "TeX",
        "Large",
        "LARGE",
        "Huge",
        "S",
        "P",
        "AA",
        "AE",
        "OE",
        "O",
        "L",
        "Alph",
        "Roman",
        "Delta",
        "Gamma",
        "Lambda",
        "Omega",
        "Phi",
        "Pi",
        "Psi",
        "Sigma",
        "Theta",
        "Upsilon",
        "Xi",
        "Leftarrow",
        "Rightarrow",
        "Leftrightarrow",
        "Longrightarrow",
    ]
)
_COMMENT = re.compile(r"(?<!\\)%.*")
_CONTROL_WORD = re.compile(r"\\([A-Za-z]+)")
_REFERENCE = re.compile(r"\\(?:" + "|".join(REFERENCE_COMMANDS) + r")\*?(?:\[[^\]]*\])*\{[^}]*\}")
_FILES = re.compile(r"\\(input|includegraphics)(?:\[[^\]]*\])?\{([^}]*)\}")


class DraftError(ValueError):
    """The template breaks a rule of the draft (message names the file and line)."""


def strip_comments(tex: str) -> str:
    return "\n".join(_COMMENT.sub("", line) for line in tex.split("\n"))


def body_lines(tex: str) -> list[tuple[int, str]]:
    """(line number, text) of the document body, comments removed."""
    lines = strip_comments(tex).split("\n")
    start = next((i for i, line in enumerate(lines) if r"\begin{document}" in line), None)
    end = next((i for i, line in enumerate(lines) if r"\end{document}" in line), len(lines))
    if start is None:
        raise DraftError(r"no \begin{document}")
    return [(number + 1, lines[number]) for number in range(start, end)]


def hand_typed_numbers(tex: str) -> list[tuple[int, str]]:
    """(line number, the line) of every body line with a digit outside macros and references."""
    found = []
    for number, line in body_lines(tex):
        bare = _CONTROL_WORD.sub(" ", _REFERENCE.sub(" ", line))
        if re.search(r"\d", bare):
            found.append((number, line.strip()))
    return found


def undefined_macros(tex: str, defined: set[str]) -> dict[str, int]:
    """{macro name: first line} of the upper-case macros the template uses and nothing defines."""
    own = defined_names(tex)
    missing: dict[str, int] = {}
    for number, line in enumerate(strip_comments(tex).split("\n"), start=1):
        for name in _CONTROL_WORD.findall(line):
            if name[0].isupper() and name not in defined and name not in own and name not in LATEX_UPPER:
                missing.setdefault(name, number)
    return missing


def missing_files(tex: str, folder: Path) -> list[str]:
    wanted = [(kind, name) for kind, name in _FILES.findall(strip_comments(tex))]
    return [
        name
        for kind, name in wanted
        if not (folder / name).is_file() and not (kind == "input" and (folder / f"{name}.tex").is_file())
    ]


def check(template: str, numbers_tex: str, where: str, folder: Path | None = None) -> None:
    """Raise DraftError naming every violation of the rules above."""
    problems = [
        f"{where}:{line}: macro \\{name} is not defined by numbers.tex (scalestudy.paper.numbers)"
        for name, line in undefined_macros(template, defined_names(numbers_tex)).items()
    ]
    problems += [
        f"{where}:{line}: a number typed by hand (use a macro of numbers.tex, or \\const{{}} for a "
        f"constant of a formula): {text}"
        for line, text in hand_typed_numbers(template)
    ]
    if folder is not None:
        problems += [
            f"{where}: \\input or \\includegraphics file not found in {folder}: {name}"
            for name in missing_files(template, folder)
        ]
    if problems:
        raise DraftError("\n".join(problems))


def render(template: str, template_name: str) -> str:
    header = (
        f"% GENERATED from {template_name} by scalestudy.paper.draft: edit the template, not this file.\n"
        "% Its numbers are the macros of numbers.tex (written from the study's tables).\n"
    )
    return header + template


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--template", required=True, help="The paper's template (report/paper/template.tex).")
    parser.add_argument("--bib", required=True, help="The BibTeX file (copied beside the paper).")
    parser.add_argument("--numbers", required=True, help="numbers.tex (scalestudy.paper.numbers).")
    parser.add_argument("--out", required=True, help="paper.tex to write.")
    parser.add_argument("--bib-out", help="Where the bibliography goes (default: beside --out).")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    out = Path(args.out)
    for path in (args.template, args.bib, args.numbers):
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such file")
    template = Path(args.template).read_text()
    try:
        check(template, Path(args.numbers).read_text(), args.template, out.parent)
    except DraftError as error:
        raise SystemExit(str(error)) from None
    bib_out = Path(args.bib_out) if args.bib_out else out.parent / Path(args.bib).name
    with atomic.atomic_path(bib_out) as temp:
        shutil.copyfile(args.bib, temp)
    atomic.write_text(out, render(template, args.template))
    log.info("%s -> %s (and %s)", args.template, out, bib_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
