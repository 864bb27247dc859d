"""`python -m scalestudy.tracking sync|schedule|follow`: the study's run folders into MLflow.

  sync      --tracking-json JSON --runs-dir results/runs [--smoke-files results/smoke/*.json]
            [--comm-files results/comm/w*.csv] [--study-files F ...] [--optional-files F ...]
            [--stop-follower PIDFILE] --out RECORD.json                       (rule `track`)
  schedule  --tracking-json JSON --points-json FILE   (a JSON list of {"point", "run"}: SCHEDULED runs)
  follow    --tracking-json JSON --journals DIR ... [--points-json FILE] [--parent-pid PID]
            [--pid-file FILE] [--log FILE]     (the study's follower: scalestudy.tracking.follow)

Exit 2 for bad input (the option is named), 1 when the tracking store cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from scalestudy import atomic, contract
from scalestudy.progress import setup_logging

log = logging.getLogger("scalestudy.tracking")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scalestudy.tracking", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sync = sub.add_parser("sync", help="replay run folders and the study's files, adding what is missing")
    sync.add_argument("--runs-dir", type=Path, default=Path("results/runs"))
    sync.add_argument("--smoke-files", nargs="*", type=Path, default=[], help="the smoke tests' results")
    sync.add_argument(
        "--comm-files", nargs="*", type=Path, default=[], help="the collective benchmark's CSVs"
    )
    sync.add_argument("--study-files", nargs="*", type=Path, default=[])
    sync.add_argument(
        "--optional-files", nargs="*", type=Path, default=[], help="study files sent if present"
    )
    sync.add_argument("--root", type=Path, default=Path("."), help="the study's folder (results/ is in it)")
    sync.add_argument("--out", type=Path, help="a JSON record of what was added")
    sync.add_argument("--stop-follower", type=Path, help="the study's follower's pid file: stopped first")
    schedule = sub.add_parser("schedule", help="SCHEDULED runs for the points not yet running")
    schedule.add_argument("--points-json", type=Path, required=True)
    follow = sub.add_parser("follow", help="the journals into MLflow while the study runs")
    follow.add_argument("--journals", nargs="+", type=Path, required=True, help="folders to watch")
    follow.add_argument("--points-json", type=Path, help="points to make SCHEDULED first")
    follow.add_argument("--parent-pid", type=int, help="stop when this parent process is gone")
    follow.add_argument("--pid-file", type=Path)
    follow.add_argument("--log", type=Path)
    for command in (sync, schedule, follow):
        command.add_argument(
            "--tracking-json", required=True, help="the settings (scalestudy.tracking.settings)"
        )
    return parser.parse_args(argv)


def load_settings(text: str) -> dict:
    try:
        tracking = json.loads(text)
    except ValueError as error:
        raise SystemExit(f"--tracking-json: not JSON ({error}): {text[:200]!r}") from None
    if not isinstance(tracking, dict) or not tracking.get("uri") or not tracking.get("experiment"):
        raise SystemExit(f"--tracking-json: needs 'uri' and 'experiment', got {text[:200]!r}")
    return tracking


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    try:
        tracking = load_settings(args.tracking_json)
        if args.command in ("schedule", "follow") and args.points_json:
            try:
                points = json.loads(args.points_json.read_text())
            except (OSError, ValueError) as error:
                raise SystemExit(f"--points-json {args.points_json}: {error}") from None
    except SystemExit as error:
        log.error("%s", error)
        return contract.EXIT_BAD_CONFIG
    if args.command == "follow":
        from scalestudy.tracking import follow

        planned = points if args.points_json else None
        return follow.main(tracking, args.journals, planned, args.parent_pid, args.pid_file, args.log)
    if args.command == "sync" and args.stop_follower:
        from scalestudy.tracking import stop_follower

        if stop_follower(args.stop_follower):
            log.info("the study's follower stopped")
    from scalestudy.tracking import preflight_runs, store, sync

    try:
        if args.command == "schedule":
            created = sync.schedule(tracking, points)
            log.info("%d SCHEDULED run(s) created in %s", len(created), tracking["experiment"])
            return 0
        files = [*args.study_files, *(path for path in args.optional_files if path.is_file())]
        record = sync.sync(tracking, args.runs_dir, files, args.root, args.smoke_files, args.comm_files)
    except preflight_runs.BadOutput as error:
        log.error("%s", error)
        return contract.EXIT_BAD_CONFIG
    except Exception as error:  # the store: unreachable, refused, ...
        log.error("MLflow at %s: %s: %s", tracking["uri"], type(error).__name__, error)
        return 1
    added = sum(run["metrics"] for run in record["runs"])
    log.info(
        "synced %d run(s) into %s: %d metric value(s) added", len(record["runs"]), tracking["uri"], added
    )
    if command := store.ui_command(tracking["uri"]):
        log.info("MLflow's UI for this store: %s", command)
    log.info("the runs in MLflow's UI: %s", record["ui"])
    record |= {"uri": tracking["uri"], "ui_command": command}  # for scripts/demo.sh's closing summary
    if args.out:
        atomic.write_json(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
