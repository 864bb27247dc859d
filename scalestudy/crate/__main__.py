"""`python -m scalestudy.crate write|add|check|validate`: the study as a Workflow Run RO-Crate.

    python -m scalestudy.crate write --out-dir results/crate --zip results/crate.zip \\
        --metadata-dir .snakemake/metadata --targets FILE... --rules-json @FILE --sources FILE... \\
        --config-files FILE... --config-json @FILE --study-json @FILE [--run-jobs JSON] [--exclude GLOB...]
    python -m scalestudy.crate add CRATE_DIR --zip ZIP FILE...   (results/report.html, once it exists)
    python -m scalestudy.crate check CRATE          (a folder or a zip: every file and its sha256)
    python -m scalestudy.crate validate CRATE [--metadata-only] [--offline|--online]
        [--severity REQUIRED|RECOMMENDED]

`write` is what rule crate (rules/crate.smk) runs; its JSON options take the JSON itself or "@FILE"
(the rule's: scalestudy.commandline.json_file); --run-jobs names the jobs of the workflow's run
(written when it started) so that the crate also lists those not behind its outputs (itself, the
jobs beside and after it). `add` puts files made after the workflow (the report: scripts/demo.sh runs
it after `snakemake --report`) into the written crate and its zip. `check` exits 1 naming each file
that is missing or changed. `validate` does what `check` does (each such file named, exit 1; with
--metadata-only its verdict line says the bytes were not checked), then runs roc-validator
(envs/requirements-dev.txt) against every profile the crate declares and exits 1 if one fails at the
severity asked for. The crate's JSON-LD contexts come from the network where it answers, else (or
with --offline) from the package; --online insists on the network. Any problem is one line on
stderr: exit 1 for a crate that fails, 2 for one not validated.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from scalestudy import commandline, contract
from scalestudy.crate import check
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.crate")


def _json(text: str, option: str):
    try:
        return commandline.json_argument(text, option)
    except ValueError as error:
        raise SystemExit(str(error)) from None


def _run_jobs(path: str | None) -> dict | None:
    """The run's jobs (--run-jobs, else the file the running workflow named); None outside a run."""
    from scalestudy.crate import RUN_JOBS_ENV

    path = path or os.environ.get(RUN_JOBS_ENV)
    return _json(f"@{path}", "--run-jobs") if path else None


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
            run_jobs=_run_jobs(args.run_jobs),
        )
    except ValueError as error:
        print(f"crate: {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    return 0


def add_command(args: argparse.Namespace) -> int:
    from scalestudy.crate.write import add_files

    try:
        added = add_files(args.crate_dir, args.zip, args.files)
    except (ValueError, OSError) as error:
        print(f"crate add: {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    print(f"{args.crate_dir} and {args.zip}: {added} file(s) added")
    return 0


def check_command(args: argparse.Namespace) -> int:
    try:
        with check.opened(args.crate) as crate_dir:
            found = check.problems(crate_dir)
            count = len(check.listed_files(crate_dir))
    except check.CrateError as error:
        print(f"crate check: {error}", file=sys.stderr)
        return 1
    for problem in found:  # named by the crate as given (a zip, not the folder it was extracted to)
        print(f"crate check: {args.crate}: {problem}", file=sys.stderr)
    if found:
        return 1
    print(f"{args.crate}: {count} files, every one present with its recorded sha256")
    return 0


def validate_command(args: argparse.Namespace) -> int:
    """roc-validator on the crate; any failure to run it is one line (exit 2), never a traceback."""
    try:
        from scalestudy.crate import validation
    except ImportError as error:  # pragma: no cover - the venv has it
        print(f"crate validate: needs roc-validator (envs/requirements-dev.txt): {error}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG
    offline = args.offline
    if offline is None:  # neither --offline nor --online: offline where the contexts cannot be fetched
        reason = validation.network_problem()
        offline = reason is not None
        if offline:
            print(f"crate validate: {reason}: the JSON-LD contexts from the package (--online to insist)")
    try:
        return _validate(args, validation, offline)
    except check.CrateError as error:
        print(f"crate validate: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # noqa: BLE001 - the validator's own failures (network, parsing)
        hint = "" if offline else " (no network? --offline serves the JSON-LD contexts from the package)"
        print(f"crate validate: {args.crate}: {validation.one_line(error)}{hint}", file=sys.stderr)
        return contract.EXIT_BAD_CONFIG


def _validate(args: argparse.Namespace, validation, offline: bool) -> int:
    with check.opened(args.crate) as crate_dir, tempfile.TemporaryDirectory() as tmp:
        if args.metadata_only:
            integrity, found = "the files' bytes not checked (--metadata-only)", []
        else:
            found = check.problems(crate_dir)
            count = len(check.listed_files(crate_dir))
            integrity = f"{count} files, each with its recorded sha256" if not found else ""
        for problem in found:  # named by the crate as given (a zip, not the folder it was extracted to)
            print(f"crate validate: {args.crate}: {problem}", file=sys.stderr)
        if found:
            integrity = f"FAILED: {len(found)} file(s) missing or changed (named above)"
        cache = validation.seed_cache(Path(tmp) / "contexts") if offline else None
        failed = bool(found)
        for profile, covered in validation.profiles_to_run(validation.declared_profiles(crate_dir)).items():
            report = validation.validate(crate_dir, profile, args.severity, offline, cache)
            failed |= not report.passed
            verdict = "passed" if report.passed else "FAILED"
            print(f"{profile} at {args.severity} (with {', '.join(covered)}): {verdict}; files: {integrity}")
            for issue in report.issues:
                print(f"  {issue}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = commandline.parser(__doc__)
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    w = commands.add_parser("write", help="Write the crate folder and zip.")
    w.add_argument("--out-dir", required=True)
    w.add_argument("--zip", required=True)
    w.add_argument("--metadata-dir", required=True, help="Snakemake's .snakemake/metadata.")
    w.add_argument("--targets", nargs="+", required=True, help="The study's outputs the crate covers.")
    w.add_argument("--rules-json", required=True, help="{rule: {output, benchmark, snakefile}}, or @FILE.")
    w.add_argument("--sources", nargs="*", default=[], help="The workflow's own files (Snakefile, rules).")
    w.add_argument("--config-files", nargs="*", default=[], help="The config files the run used.")
    w.add_argument("--config-json", required=True, help="The effective config, or @FILE.")
    w.add_argument("--study-json", required=True, help="{title, name, license, author, url}, or @FILE.")
    w.add_argument(
        "--run-jobs",
        help="The jobs of the workflow's run (JSON: scalestudy.crate.record_run_jobs; default: the file the "
        "running workflow names in $SCALESTUDY_RUN_JOBS; none outside a run).",
    )
    w.add_argument("--exclude", nargs="*", default=[], help="Globs of outputs described but not carried.")
    w.set_defaults(run=write)
    a = commands.add_parser("add", help="Add files made after the workflow (the report) to a crate.")
    a.add_argument("crate_dir")
    a.add_argument("--zip", required=True)
    a.add_argument("files", nargs="+")
    a.set_defaults(run=add_command)
    c = commands.add_parser("check", help="Every file of a crate present, with its recorded sha256.")
    c.add_argument("crate")
    c.set_defaults(run=check_command)
    v = commands.add_parser(
        "validate",
        help="Every file's sha256 (as `check`), then roc-validator against every declared profile.",
    )
    v.add_argument("crate")
    v.add_argument(
        "--metadata-only",
        action="store_true",
        help="Skip the files' checksums (`check`); the verdict says so.",
    )
    v.add_argument("--severity", default="REQUIRED", choices=("REQUIRED", "RECOMMENDED"))
    network = v.add_mutually_exclusive_group()
    network.add_argument(
        "--offline", action="store_true", default=None, help="Serve the JSON-LD contexts from the package."
    )
    network.add_argument(
        "--online", dest="offline", action="store_false", help="Fetch the JSON-LD contexts, even slowly."
    )
    v.set_defaults(run=validate_command)
    args = parser.parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
