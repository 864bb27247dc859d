"""`python -m scalestudy.compare A B`: two studies compared point by point.

    python -m scalestudy.compare A B [--axis KEY ...] [--label-a NAME --label-b NAME]
        [--analysis-json JSON | --config CONFIG] [--table CSV] [--summary JSON] [--markdown MD]
        [--png PNG [--pdf PDF]]

A and B: a study's results/ folder (or the folder holding it), its crate folder or its crate.zip
(checked first: a missing or changed file stops the comparison, naming it). Ratios are B / A.
Prints the comparison as Markdown; the options write the table, the summary, the text and the
figure. Exit 0 whatever the verdicts; 2 for a study that cannot be read (named).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from scalestudy import atomic
from scalestudy.analysis import cli
from scalestudy.compare import points, report, study
from scalestudy.crate.check import CrateError


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli.parser(__doc__.splitlines()[0])
    parser.add_argument("a", help="The reference study (A).")
    parser.add_argument("b", help="The study compared with it (B).")
    parser.add_argument(
        "--axis", nargs="*", default=[], help="Run-config keys A and B are meant to differ in."
    )
    parser.add_argument("--label-a", help="A's name in the outputs (default: its folder's name).")
    parser.add_argument("--label-b", help="B's name in the outputs (default: its folder's name).")
    parser.add_argument("--table", help="The comparison table (CSV) to write.")
    parser.add_argument("--summary", help="The summary (JSON) to write.")
    parser.add_argument("--markdown", help="The comparison as Markdown, to write.")
    parser.add_argument("--png", help="The figure (PNG) to write.")
    parser.add_argument("--pdf", help="The figure as PDF, with --png.")
    args = parser.parse_args(argv)
    settings = cli.start(args)
    try:
        a = study.load(args.a, settings, args.label_a)
        b = study.load(args.b, settings, args.label_b)
    except (OSError, ValueError, CrateError) as error:
        print(f"compare: {error}", file=sys.stderr)
        return 2
    table = points.compare(a, b, settings["confidence"], args.axis)
    info = report.summary(table, a, b)
    text = report.markdown(table, info)
    if args.table:
        atomic.write_csv(args.table, table)
    if args.summary:
        atomic.write_json(args.summary, info)
    if args.markdown:
        atomic.write_text(args.markdown, text)
    if args.png:
        report.figure(table, info, args.png, args.pdf)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
