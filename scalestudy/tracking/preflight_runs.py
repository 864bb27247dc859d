"""The checks before the study as MLflow points, from what their rules wrote (rule `track`'s replay;
scalestudy.tracking.sync adds only what a run lacks):

- a smoke test's result results/smoke/<name>.json (point `smoke/<name>`): `io` (the loader and the
  checkpoint, a one-rank job) and `train_w<N>` (a few training steps at world size N, whose trainer's
  run folder results/smoke/train_w<N>/ gives the run what a grid point's run folder gives: it is the
  run the trainer streamed live). Params: its run config; metrics (step 0): the result's figures,
  `smoke_<figure>` (`smoke_wall_s`, `smoke_loader_images_per_s`, `smoke_checkpoint_write_mb_s`, ...);
- a world size's collective benchmark results/comm/w<N>.csv (point `comm_bench/w<N>`). Params: its
  settings (the ones its provenance's command line was given, defaults filled in, which the config
  hash is of); metrics: per collective `<collective>_busbw_gb_s`, `_algbw_gb_s` and `_time_s` per
  message size (step = the message's bytes), and `summary_<collective>_busbw_at_max_gb_s` (at the
  largest size, as the fit table's busbw_at_max_gb_s) and `summary_<collective>_busbw_peak_gb_s`
  (step 0).

Tags: stage (`smoke`, `comm_bench`), point, world size, nodes, hosts, config hash, git commit, image,
attempt, and the Slurm job id and node list where the provenance has them. Artifacts: the output
file, and in `logs/` the rule's log (with its attempts') and Snakemake's benchmark file. Times: the
job's own, as recorded (`recorded_times`: it ended when its result's provenance was taken, and
started its benchmark's wall seconds before), never the sync's; a smoke training step's are its
trainer's (its journal).
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
from pathlib import Path
from typing import Any

from scalestudy import provenance
from scalestudy.plan import paths
from scalestudy.tracking import point_tags, store

SMOKE_STAGE = "smoke"
COMM_STAGE = "comm_bench"
# A smoke result's figures logged as smoke_<section>_<key> (io) or smoke_<key> (a training step).
SMOKE_IO_METRICS = {
    "loader": ("images_per_s", "first_batch_s", "seconds"),
    "checkpoint": (
        "bytes",
        "write_s",
        "read_s",
        "write_mb_s",
        "read_mb_s",
        "saves_per_epoch",
        "save_s_per_epoch",
    ),
}
SMOKE_STEP_METRICS = ("wall_s", "steps", "step_time_s", "images_per_s")
COMM_SERIES = ("busbw_gb_s", "algbw_gb_s", "time_s")  # per message size
PROVENANCE_PREFIX = "provenance."  # the benchmark CSV's provenance columns


class BadOutput(ValueError):
    """A smoke result or benchmark CSV the sync cannot read; the message names the file."""


def provenance_tags(prov: dict[str, Any]) -> dict[str, str]:
    """The tags a provenance record (scalestudy.provenance.collect, or a summary's) decides."""
    git = prov.get("git") if isinstance(prov.get("git"), dict) else prov
    values = {
        "git_commit": git.get("git_commit") or git.get("commit"),
        "git_dirty": git.get("git_dirty") if "git_dirty" in git else git.get("dirty"),
        "image": prov.get("image"),
        "image_sha256": prov.get("image_sha256"),
        "attempt": prov.get("attempt"),
    }
    return {key: str(value) for key, value in values.items() if value not in (None, "")}


def _stem(output: Path, root: Path) -> Path | None:
    """<dir>/<name> of an output results/<dir>/<name>.<ext> (None: not under results/)."""
    try:
        return output.resolve().with_suffix("").relative_to((root / paths.RESULTS_DIR).resolve())
    except ValueError:
        return None


def benchmark_file(output: Path, root: Path) -> Path | None:
    """Snakemake's benchmark file of the rule that wrote `output`: results/benchmarks/<dir>/<name>.tsv."""
    stem = _stem(output, root)
    benchmark = root / paths.BENCHMARKS_DIR / stem.parent / f"{stem.name}.tsv" if stem else None
    return benchmark if benchmark and benchmark.is_file() else None


def rule_logs(output: Path, root: Path) -> list[Path]:
    """The rule's log (and its attempts') and benchmark file of an output results/<dir>/<name>.<ext>:
    results/logs/<dir>/<name>.log*, results/benchmarks/<dir>/<name>.tsv."""
    stem = _stem(output, root)
    if stem is None:
        return []
    log = root / paths.LOGS_DIR / stem
    found = sorted(log.parent.glob(f"{log.name}.log*")) if log.parent.is_dir() else []
    benchmark = benchmark_file(output, root)
    return found + ([benchmark] if benchmark else [])


def recorded_times(timestamp: str | None, output: Path, root: Path) -> dict[str, float | None]:
    """{started, ended} (Unix seconds) of the job that wrote `output`: it ended when its result's
    provenance was taken (`timestamp`, ISO 8601, to the second) and started its Snakemake benchmark's
    wall seconds (`s`) before, so the run lasts what the job lasted. Without a timestamp: None (the
    sync's time); without a benchmark file: started = ended."""
    try:
        ended = _dt.datetime.fromisoformat(str(timestamp)).timestamp()
    except ValueError:
        return {"started": None, "ended": None}
    wall = 0.0
    benchmark = benchmark_file(output, root)
    if benchmark:
        with open(benchmark, newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t"))
        wall = store.metric_value(rows[-1].get("s")) if rows else None  # the last attempt's
    return {"started": ended - (wall or 0.0), "ended": ended}


# --------------------------------------------------------------------------- smoke tests


def read_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BadOutput(f"{path}: not a smoke test's result ({error})") from None
    if (
        not isinstance(record, dict)
        or record.get("check") not in ("io", "step")
        or "run_config" not in record
    ):
        raise BadOutput(f"{path}: not a smoke test's result (needs 'check' io or step and 'run_config')")
    return record


def smoke_metrics(record: dict[str, Any]) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    if record["check"] == "io":
        for section, keys in SMOKE_IO_METRICS.items():
            for key in keys:
                store.put_metric(found, f"smoke_{section}_{key}", 0, record.get(section, {}).get(key))
    else:
        for key in SMOKE_STEP_METRICS:
            store.put_metric(found, f"smoke_{key}", 0, record.get(key))
    return found


def smoke_tags(record: dict[str, Any]) -> dict[str, str]:
    """What the result says beyond its run config: the job's shape and where it ran."""
    prov = record.get("provenance", {})
    if record["check"] == "io":  # one rank, whatever the run config's (the grid's largest) world size
        values = {
            "world_size": 1,
            "nodes": 1,
            "hosts": prov.get("host"),
            "loader": record["loader"]["loader"],
        }
        values["device"] = record["loader"].get("device")
    else:
        hosts = record.get("hosts") or []
        values = {"world_size": record.get("world_size"), "hosts": ",".join(hosts) or prov.get("host")}
        values |= {"backend": record.get("backend"), "device_name": record.get("device_name")}
    values["smoke_check"] = record["check"]
    tags = {key: str(value) for key, value in values.items() if value not in (None, "")}
    return provenance_tags(prov) | tags


def smoke_filling(path: Path, tracking: dict, root: Path, trained: store.Filling | None) -> store.Filling:
    """A smoke test's point; `trained`: what its trainer's run folder gives (a training step's)."""
    record = read_record(path)
    given = record["run_config"]
    point = f"{SMOKE_STAGE}/{path.stem}"
    filling = trained or store.Filling(
        tags=point_tags(point, provenance.config_hash(given), given, tracking["study"]),
        given=given,
        **recorded_times(record.get("provenance", {}).get("timestamp"), path, root),
    )
    more = smoke_tags(record)
    for key in ("world_size", "nodes"):  # io: the job's shape, not its run config's
        if key in more:
            filling.tags[key] = more.pop(key)
    filling.more_tags |= more
    slurm = record.get("provenance", {}).get("slurm") or {}
    filling.slurm.append((slurm.get("job_id"), slurm.get("job_nodelist")))
    filling.metrics |= smoke_metrics(record)
    filling.artifacts[""] = [*filling.artifacts.get("", []), path]
    filling.artifacts["logs"] = sorted({*filling.artifacts.get("logs", []), *rule_logs(path, root)})
    return filling


# --------------------------------------------------------------------------- collective benchmark


def read_bench(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, csv.Error) as error:
        raise BadOutput(f"{path}: not a collective benchmark's CSV ({error})") from None
    needed = {"collective", "world_size", "bytes", *COMM_SERIES}
    if not rows or needed - set(rows[0]):
        raise BadOutput(
            f"{path}: not a collective benchmark's CSV (needs rows with {', '.join(sorted(needed))})"
        )
    return rows


def bench_settings(prov: dict[str, str]) -> dict[str, Any] | None:
    """The settings the benchmark ran with (its command line's --settings-json, defaults filled in)."""
    from scalestudy.preflight import collectives

    try:
        command = json.loads(prov.get("command") or "[]")
        return collectives.settings_from_json(command[command.index("--settings-json") + 1])
    except (ValueError, IndexError, TypeError, AttributeError):
        return None


def comm_metrics(rows: list[dict[str, str]]) -> dict[str, dict[int, float]]:
    found: dict[str, dict[int, float]] = {}
    for row in rows:
        for column in COMM_SERIES:
            store.put_metric(found, f"{row['collective']}_{column}", int(row["bytes"]), row[column])
    for collective in dict.fromkeys(row["collective"] for row in rows):
        busbw = found.get(f"{collective}_busbw_gb_s")
        if busbw:  # only the sizes with a time (an unsupported collective has none)
            store.put_metric(found, f"summary_{collective}_busbw_at_max_gb_s", 0, busbw[max(busbw)])
            store.put_metric(found, f"summary_{collective}_busbw_peak_gb_s", 0, max(busbw.values()))
    return found


def comm_filling(path: Path, tracking: dict, root: Path) -> store.Filling:
    """A world size's collective benchmark point."""
    rows = read_bench(path)
    first = rows[0]
    prov = {
        key.removeprefix(PROVENANCE_PREFIX): value
        for key, value in first.items()
        if key.startswith(PROVENANCE_PREFIX)
    }
    settings = bench_settings(prov)
    config_hash = prov.get("config_hash") or provenance.config_hash(settings)
    shape = {"world_size": first["world_size"], "nodes": first.get("nodes") or None}
    tags = point_tags(f"{COMM_STAGE}/{path.stem}", config_hash, shape, tracking["study"])
    more = {key: first.get(key) for key in ("placement", "backend", "device", "hosts")}
    more["comm_notes"] = "; ".join(sorted({row["note"] for row in rows if row.get("note")}))
    return store.Filling(
        tags=tags,
        given=settings,
        more_tags=provenance_tags(prov) | {key: value for key, value in more.items() if value},
        slurm=[(prov.get("slurm.job_id") or None, prov.get("slurm.job_nodelist") or None)],
        metrics=comm_metrics(rows),
        artifacts={"": [path], "logs": rule_logs(path, root)},
        **recorded_times(prov.get("timestamp"), path, root),
    )
