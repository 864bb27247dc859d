"""Rank 0's GPU monitor files (scalestudy.train.gpu_monitor, "Gathering"): every rank's report
merged into `gpu_monitor.csv` (sorted by time, host and GPU) and `gpu_monitor.json` (available,
reason, per node its sampled GPUs with rank, power limit, GPM support and errors), each atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scalestudy import atomic
from scalestudy.plan import runfiles
from scalestudy.plan.runfiles import MONITOR_COLUMNS as COLUMNS
from scalestudy.train.energy_counter import energy_note


def _nodes(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank reports grouped by host, in the order hosts first appear."""
    nodes: dict[str, dict[str, Any]] = {}
    for report in reports:
        node = nodes.setdefault(
            report["host"], {"host": report["host"], "ranks": [], "reasons": [], "gpus": [], "cpus": set()}
        )
        node["ranks"].append(report.get("rank"))
        node["gpus"] += report["gpus"]
        node["cpus"].update(report.get("cpus") or ())
        if report["reason"]:
            node["reasons"].append(f"rank {report.get('rank')}: {report['reason']}")
    for node in nodes.values():
        node["cpus"] = sorted(node["cpus"])  # the job's CPUs on the host: its ranks' affinity
        node["available"] = bool(node["gpus"]) and not any(gpu["failed"] for gpu in node["gpus"])
        node["reason"] = "; ".join(node.pop("reasons")) or None
    return list(nodes.values())


def write_outputs(out_dir: str | Path, reports: list[dict[str, Any] | None], interval_s: float) -> None:
    """Rank 0: merge the rank reports into gpu_monitor.csv and gpu_monitor.json."""
    import pandas as pd

    reports = [report for report in reports if report is not None]
    rows = sorted((row for report in reports for row in report["rows"]), key=lambda row: row[:3])
    atomic.write_csv(Path(out_dir) / runfiles.GPU_MONITOR, pd.DataFrame(rows, columns=COLUMNS))
    reasons = sorted({report["reason"] for report in reports if not report["available"]})
    gpus = [gpu for report in reports for gpu in report["gpus"]]
    summary = {
        "available": bool(reports) and not reasons,
        "reason": "; ".join(reasons) if reasons else (None if reports else "no rank ran a monitor"),
        "interval_s": interval_s,
        "samples": len(rows),
        "sm_active": _gpm_note(gpus),
        "energy": energy_note(gpus),
        "processes": "; ".join(sorted({r["process_query"] for r in reports if r.get("process_query")}))
        or None,
        "failed_gpus": [gpu["uuid"] for gpu in gpus if gpu["failed"]],
        "nodes": _nodes(reports),
    }
    atomic.write_json(Path(out_dir) / runfiles.GPU_MONITOR_INFO, summary)


def _gpm_note(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return f"{runfiles.NOT_MEASURED}: no GPU sampled"
    unsupported = sorted({f"{gpu['name']}: {gpu['gpm_reason']}" for gpu in gpus if not gpu["gpm_supported"]})
    if not unsupported:
        return "NVML GPM (NVML_GPM_METRIC_SM_UTIL)"
    return f"{runfiles.NOT_MEASURED} on " + "; ".join(unsupported)
