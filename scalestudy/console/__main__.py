"""`python -m scalestudy.console condense|summary`: what scripts/demo.sh prints (the package's docstring)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from scalestudy import commandline


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("condense", help="Snakemake's console on stdin, shortened, to stdout.")
    summary = commands.add_parser("summary", help="The closing summary of a finished study.")
    summary.add_argument("--root", default=".", help="The workflow folder (holding results/).")
    summary.add_argument("--name", default="demo", help="Who says it (default demo).")
    summary.add_argument("--seconds", type=float, help="How long the study took.")
    args = parser.parse_args(argv)
    if args.command == "condense":
        from scalestudy.console import condense

        return condense.main(sys.stdin, sys.stdout)
    from scalestudy.console import summary as closing

    print("\n".join(closing.summary(Path(args.root), args.name, args.seconds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
