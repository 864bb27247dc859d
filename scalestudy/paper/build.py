"""results/paper/paper.pdf from paper.tex with latexmk (pdflatex + BibTeX), checked.

    python -m scalestudy.paper.build --tex results/paper/paper.tex --pdf results/paper/paper.pdf

latexmk runs in a temporary folder beside paper.tex (the auxiliary files never mix with the
results); the PDF is moved into place only when the log has no error, no undefined reference or
citation and no missing file (`problems`). Without latexmk on PATH it exits 2 and says what to
install (the workflow only asks for the PDF where latexmk exists: rules/paper.smk).
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scalestudy import atomic, commandline, contract
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.paper.build")

LATEXMK = "latexmk"
INSTALL_HINT = "install TeX Live (Debian: tests/tex/install.sh) or set paper.pdf: never"
# Lines of a LaTeX log that make the PDF wrong, not just ugly.
_PROBLEMS = re.compile(
    r"^(! .*"
    r"|.*:\d+: .*"  # -file-line-error form of an error
    r"|LaTeX Warning: (Reference|Citation) .* undefined.*"
    r"|LaTeX Warning: There were undefined references.*"
    r"|Package natbib Warning: Citation .* undefined.*"
    r"|LaTeX Warning: File .* not found.*"
    r"|LaTeX Error: .*)$"
)


def latexmk_available(command: str = LATEXMK) -> bool:
    return shutil.which(command) is not None


def problems(log_text: str) -> list[str]:
    """The lines of a LaTeX log that mean an error, an undefined reference or citation, or a missing file."""
    return [line for line in log_text.splitlines() if _PROBLEMS.match(line)]


def command(tex: Path, out_dir: Path, latexmk: str = LATEXMK) -> list[str]:
    return [
        latexmk, "-pdf", "-interaction=nonstopmode", "-halt-on-error", "-file-line-error",
        f"-outdir={out_dir}", tex.name,
    ]  # fmt: skip


def build(tex: Path, pdf: Path, latexmk: str = LATEXMK, timeout_s: float = 300) -> None:
    if not latexmk_available(latexmk):
        raise SystemExit(f"{latexmk}: not found on PATH; cannot build {pdf} ({INSTALL_HINT})")
    if not tex.is_file():
        raise SystemExit(f"{tex}: no such file")
    with tempfile.TemporaryDirectory(prefix=".latexmk-", dir=tex.parent) as work:
        argv = command(tex, Path(work).resolve(), latexmk)
        log.info("%s (in %s)", " ".join(argv), tex.parent)
        result = subprocess.run(argv, cwd=tex.parent, capture_output=True, text=True, timeout=timeout_s)
        log_file = Path(work) / f"{tex.stem}.log"
        log_text = log_file.read_text(errors="replace") if log_file.is_file() else ""
        found = problems(log_text)
        if result.returncode != 0 or found or not (Path(work) / f"{tex.stem}.pdf").is_file():
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-30:])
            raise SystemExit(
                f"{tex}: latexmk failed (exit {result.returncode}); problems in the LaTeX log:\n"
                + "\n".join(found or ["(none found; latexmk output follows)"])
                + f"\n--- latexmk output (last lines) ---\n{tail}"
            )
        with atomic.atomic_path(pdf, suffix=".pdf") as temp:
            shutil.copyfile(Path(work) / f"{tex.stem}.pdf", temp)
    log.info("%s -> %s", tex, pdf)


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--tex", required=True, help="paper.tex (its \\input files beside it).")
    parser.add_argument("--pdf", required=True, help="The PDF to write.")
    parser.add_argument("--latexmk", default=LATEXMK, help="The latexmk command.")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    try:
        build(Path(args.tex), Path(args.pdf), args.latexmk)
    except SystemExit as error:
        if isinstance(error.code, str):
            log.error("%s", error.code)
            return contract.EXIT_BAD_CONFIG
        raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
