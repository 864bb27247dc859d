"""`python -m scalestudy.crate write|check|validate`: the study as a Workflow Run RO-Crate.

    python -m scalestudy.crate write --out-dir results/crate --zip results/crate.zip \\
        --metadata-dir .snakemake/metadata --targets FILE... --rules-json JSON --sources FILE... \\
        --config-files FILE... --config-json JSON --study-json JSON [--exclude GLOB...]
    python -m scalestudy.crate check CRATE          (a folder or a zip: every file and its sha256)
    python -m scalestudy.crate validate CRATE [--offline] [--severity REQUIRED|RECOMMENDED]

`write` is what rule crate (rules/crate.smk) runs. `check` exits 1 naming each file that is missing
or changed. `validate` runs roc-validator (envs/requirements-dev.txt) against every profile the
crate declares and exits 1 if one fails at the severity asked for; --offline serves the crate's
JSON-LD contexts from the package instead of the network.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scalestudy.crate import check
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.crate")


def _json(text: str, option: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise SystemExit(f"{option}: not JSON ({error})") from None


def write(args: argparse.Namespace) -> int:
    from scalestudy.crate.write import write_crate

    try:
        write_crate(
            args.out_dir,
            args.zip,
            metadata_dir=args.metadata_dir,
            targets=args.targets,
            rules=_json(args.rules_json, "--rules-json"),
            sources=args.sources,
            config_files=args.config_files,
            config=_json(args.config_json, "--config-json"),
            study=_json(args.study_json, "--study-json"),
            exclude=args.exclude,
        )
    except ValueError as error:
        print(f"crate: {error}", file=sys.stderr)
        return 2
    return 0


def check_command(args: argparse.Namespace) -> int:
    try:
        with check.opened(args.crate) as crate_dir:
            check.verify(crate_dir)
            count = len(check.listed_files(crate_dir))
    except check.CrateError as error:
        print(f"crate check: {error}", file=sys.stderr)
        return 1
    print(f"{args.crate}: {count} files, every one present with its recorded sha256")
    return 0


def validate_command(args: argparse.Namespace) -> int:
    from scalestudy.crate import validation

    with check.opened(args.crate) as crate_dir, tempfile.TemporaryDirectory() as tmp:
        cache = validation.seed_cache(Path(tmp) / "contexts") if args.offline else None
        failed = False
        for profile, covered in validation.profiles_to_run(validation.declared_profiles(crate_dir)).items():
            report = validation.validate(crate_dir, profile, args.severity, args.offline, cache)
            failed |= not report.passed
            verdict = "passed" if report.passed else "FAILED"
            print(f"{profile} at {args.severity} (with {', '.join(covered)}): {verdict}")
            for issue in report.issues:
                print(f"  {issue}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    w = commands.add_parser("write", help="Write the crate folder and zip.")
    w.add_argument("--out-dir", required=True)
    w.add_argument("--zip", required=True)
    w.add_argument("--metadata-dir", required=True, help="Snakemake's .snakemake/metadata.")
    w.add_argument("--targets", nargs="+", required=True, help="The study's outputs the crate covers.")
    w.add_argument("--rules-json", required=True, help="{rule: {output, benchmark, snakefile}}.")
    w.add_argument("--sources", nargs="*", default=[], help="The workflow's own files (Snakefile, rules).")
    w.add_argument("--config-files", nargs="*", default=[], help="The config files the run used.")
    w.add_argument("--config-json", required=True, help="The effective config.")
    w.add_argument("--study-json", required=True, help="{title, name, license, author, url}.")
    w.add_argument("--exclude", nargs="*", default=[], help="Globs of outputs described but not carried.")
    w.set_defaults(run=write)
    c = commands.add_parser("check", help="Every file of a crate present, with its recorded sha256.")
    c.add_argument("crate")
    c.set_defaults(run=check_command)
    v = commands.add_parser("validate", help="roc-validator against every profile the crate declares.")
    v.add_argument("crate")
    v.add_argument("--severity", default="REQUIRED", choices=("REQUIRED", "RECOMMENDED"))
    v.add_argument("--offline", action="store_true", help="Serve the JSON-LD contexts from the package.")
    v.set_defaults(run=validate_command)
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
