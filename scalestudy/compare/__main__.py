"""`python -m scalestudy.compare A B`: two studies compared point by point.

    python -m scalestudy.compare A B [--axis KEY ...] [--allow-different] [--label-a NAME --label-b NAME]
        [--fail-on slower|faster|different|any-slower|any-faster|untested ...]
        [--analysis-json JSON | --config CONFIG] [--table CSV] [--summary JSON] [--markdown MD]
        [--png PNG [--pdf PDF]]

A and B: a study's results/ folder (or the folder holding it), its crate folder or its crate.zip
(checked first: a missing or changed file stops the comparison, naming it). Ratios are B / A.
Prints the comparison as Markdown, opening with the study-level verdict (all points pooled:
scalestudy.compare.pooled); the options write the table, the summary, the text and the figure.

Exit 0 whatever the verdicts, unless --fail-on names one that holds (a CI gate): exit 1 with one
line on stderr. slower / faster: the study-level verdict; different: either; any-slower /
any-faster: the study-level verdict or any one point's (each point tested alone: with many points,
one in twenty is called different by chance at 95 %); untested: no study-level verdict (no point
in both studies with a filled window). Exit 2 for a study that cannot be read (named); 3 where
points matched by name differ in run config beyond the --axis keys (the two are not the same
experiment: one line names the keys), unless --allow-different (then one warning line opens the
text).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from scalestudy import atomic, commandline, contract
from scalestudy.analysis import cli
from scalestudy.compare import figure, points, pooled, report, study
from scalestudy.crate.check import CrateError
from scalestudy.progress import quiet

EXIT_GATE = 1  # a verdict named by --fail-on holds
EXIT_NOT_THE_SAME = 3  # and contract.EXIT_BAD_CONFIG (2): a study that cannot be read
ANALYSIS_LOGGER = "scalestudy.analysis"
GATES = ("slower", "faster", "different", "any-slower", "any-faster", "untested")


def arguments(argv: Sequence[str] | None):
    parser = cli.parser(__doc__.splitlines()[0])
    parser.prog = commandline.program(__spec__)  # also where main() is called in another program
    parser.add_argument("a", help="The reference study (A).")
    parser.add_argument("b", help="The study compared with it (B).")
    parser.add_argument(
        "--axis", nargs="*", default=[], help="Run-config keys A and B are meant to differ in."
    )
    parser.add_argument(
        "--allow-different",
        action="store_true",
        help="Compare even where matched points differ in run-config keys other than --axis (a warning "
        "line opens the text; without it the comparison is refused, exit 3).",
    )
    parser.add_argument(
        "--fail-on",
        nargs="+",
        default=[],
        choices=GATES,
        metavar="VERDICT",
        help=f"Exit {EXIT_GATE} where one of these holds ({', '.join(GATES)}): the study-level verdict "
        "(slower, faster, different: either), also any one point's (any-slower, any-faster), or no "
        "study-level verdict (untested).",
    )
    named = "(default: the study's name in its crate, else its folder's; a name both share gets the "
    named += "commit, run dates or folder that tells them apart)"
    parser.add_argument("--label-a", help=f"A's name {named}.")
    parser.add_argument("--label-b", help=f"B's name {named}.")
    parser.add_argument("--table", help="The comparison table (CSV) to write.")
    parser.add_argument("--summary", help="The summary (JSON) to write.")
    parser.add_argument("--markdown", help="The comparison as Markdown, to write.")
    parser.add_argument("--png", help="The figure (PNG) to write.")
    parser.add_argument("--pdf", help="The figure as PDF, with --png.")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    # The warnings of a study's own tables (gpus_per_node assumed, a window not filled, a contended
    # run) are the tables'; the comparison says what concerns it (not tested, contended points).
    with quiet(ANALYSIS_LOGGER):
        settings = cli.start(args)
        try:
            a = study.load(args.a, settings, args.label_a)
            b = study.load(args.b, settings, args.label_b)
        except (OSError, ValueError, CrateError) as error:
            print(f"compare: {error}", file=sys.stderr)
            return contract.EXIT_BAD_CONFIG
    a.label, b.label = study.distinguish(a, b)
    table = points.compare(a, b, settings["confidence"], args.axis)
    different = report.not_the_same(table, a.label, b.label)
    if different and not args.allow_different:
        keys = " ".join(points.differing_keys(table))
        print(
            f"compare: refused: {different} (name the keys the studies are meant to differ in: "
            f"--axis {keys}; or compare anyway: --allow-different)",
            file=sys.stderr,
        )
        return EXIT_NOT_THE_SAME
    info = report.summary(table, a, b, allowed_different=bool(different))
    text = report.markdown(table, info)
    if args.table:
        atomic.write_csv(args.table, table)
    if args.summary:
        atomic.write_json(args.summary, info)
    if args.markdown:
        atomic.write_text(args.markdown, text)
    if args.png:
        figure.figure(table, info, args.png, args.pdf)
    sys.stdout.write(text)
    return gate(args.fail_on, info)


def gate(fail_on: Sequence[str], info: dict) -> int:
    """EXIT_GATE with one line naming what held, where a verdict --fail-on names holds; else 0."""
    verdict = info["study"]["verdict"]
    held = {
        "slower": verdict == points.SLOWER,
        "faster": verdict == points.FASTER,
        "different": verdict in (points.SLOWER, points.FASTER),
        "any-slower": verdict == points.SLOWER or info["slower"] > 0,
        "any-faster": verdict == points.FASTER or info["faster"] > 0,
        "untested": verdict.startswith(points.NOT_TESTED),
    }
    failed = [name for name in fail_on if held[name]]
    if not failed:
        return 0
    study_line = pooled.sentence(info["study"], info["confidence"])
    named = ", ".join(p["point"] for p in info["slower_points"] + info["faster_points"])
    print(
        f"compare: --fail-on {' '.join(failed)}: {study_line}" + (f" Points: {named}." if named else ""),
        file=sys.stderr,
    )
    return EXIT_GATE


if __name__ == "__main__":
    raise SystemExit(main())
