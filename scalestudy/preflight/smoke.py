"""Smoke tests before the study: minutes that find a broken setting before a grid of jobs queues.

- `io`: the training data loader alone (images/s per rank, against smoke.loader_min_images_per_s)
  and the real model's checkpoint: size, write and read bandwidth, and what the saves cost per epoch;
- `step`: the real trainer through scalestudy.launch for a few steps at one world size (NCCL_DEBUG=INFO
  on GPUs, the lines naming NCCL's transport kept); a failing step fails with the trainer's exit code;
- `table`: every smoke result as rows of results/tables/smoke.csv.

A failed test exits 1 and writes no result; every training job waits for the results
(rules/smoke.smk). The commands and what each test measures: docs/reference/methods.md, "Smoke tests".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scalestudy.launch import distributed
from scalestudy.plan import grid, runconfig, runfiles, schema, workloads
from scalestudy.preflight import common

log = logging.getLogger("scalestudy.smoke")

SMOKE_DIR = "results/smoke"
CHECKPOINTS = f"{grid.CHECKPOINTS_DIR}/smoke"
EXIT_FAILED = 1
# NCCL INFO lines worth keeping: version, the transport chosen (NET/IB, NET/Socket, P2P, SHM), rings.
NCCL_KEEP = ("NCCL version", "NET/", "Using network", "via P2P", "via SHM", "Channel 00")
IO_KEYS = ("loader_batches", "loader_min_images_per_s", "checkpoint_repeats")  # what `io` reads
TABLE_COLUMNS = ("check", "world_size", "value", "unit", "detail")


class SmokeFailure(RuntimeError):
    """A smoke test found the study cannot run as configured; the message says why."""


# --------------------------------------------------------------------------- run configs


def step_run_config(config: dict, world: int) -> dict[str, Any]:
    """A few steps of the first scaling mode's point at `world` (its real per-rank batch), with the
    grid's last parallelism (fsdp where the grid has it: the more moving parts), eager: a compiled
    step would compile here first (tens of seconds on a GPU, before the gate); the compile jobs and
    the points compile it (rules/compile.smk)."""
    smoke = config["smoke"]
    parallelism = (config["scaling"].get("parallelism") or schema.defaults("scaling")["parallelism"])[-1]
    point = grid.scaling_point(config, config["scaling"]["modes"][0], world, 0, parallelism)
    run = grid.run_config(config, point)
    run.update(
        stage="smoke",
        point=f"w{world}",
        epochs=1,
        max_steps_per_epoch=smoke["train_steps"],
        eval_max_batches=1,
        checkpoint_dir=f"{CHECKPOINTS}/w{world}",
        log_every_steps=1,
        step_timing_every=1,
    )
    if run.get("compile"):
        run["compile"] = False
        for key in ("inductor_cache_dir", "compile_cache_load"):
            run.pop(key, None)
    return run


def io_run_config(config: dict) -> dict[str, Any]:
    """The loader and model settings of the grid's largest scaling point (the most data per second)."""
    return step_run_config(config, max(config["scaling"]["world_sizes"]))


def saves_per_epoch(config: dict, train_images: int | None = None) -> dict[str, Any]:
    """Checkpoint saves per epoch at the grid's most frequent checkpointing: the point with the most
    steps per epoch (the smallest global batch, max_steps_per_epoch applied). The samples per epoch
    (train_images: images, or the LM's sequences) are the grid's; where only preprocessing knows them
    (a downloaded corpus), max_steps_per_epoch bounds the steps, else they count as one step."""
    images = train_images or grid.samples_per_epoch(config)
    runs = [grid.run_config(config, p) for p in grid.all_points(config)]
    steps = max(_steps_per_epoch(run, images) for run in runs)
    every = config["train"]["checkpoint_every_steps"]  # 0 or null: only the epoch's end saves
    return {
        "train_images": images,
        "steps_per_epoch": steps,
        "checkpoint_every_steps": every,
        "saves_per_epoch": math.ceil(steps / every) if every else 1,
    }


def _steps_per_epoch(run: dict[str, Any], samples: int | None) -> int:
    cap = run["max_steps_per_epoch"] or math.inf
    if samples:
        return min(samples // run["global_batch"], cap)
    return 1 if cap == math.inf else cap


# --------------------------------------------------------------------------- io: loader + checkpoint


def _full(run: dict[str, Any]) -> dict[str, Any]:
    """The run config with the trainer's defaults filled in (what the workload's builders read)."""
    return {**runconfig.DEFAULTS, **run, "max_steps_per_epoch": None}


def loader_throughput(run: dict[str, Any], batches: int) -> dict[str, Any]:
    """Samples/s (images, tokens: the key keeps its name) of the run's training loader alone on this
    process's device (first batch excluded): the workload's loader, as one rank of the run uses it."""
    import torch  # torch only in the job: the Snakefile imports this module

    device = distributed.select_device(run["device"], 0)
    full = _full(run)
    data, _ = workloads.get(full["workload"]).runtime_module().build_data(full, 0, 1, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    timed, images_seen, epoch, first_s = 0, 0, 0, None
    start = time.perf_counter()
    while timed < batches:
        for _, targets in data.epoch(epoch):
            sync()
            if first_s is None:  # worker start-up, first copies: not the steady rate
                first_s = time.perf_counter() - start
                start = time.perf_counter()
                continue
            timed, images_seen = timed + 1, images_seen + targets.numel()
            if timed == batches:
                break
        epoch += 1
    elapsed = time.perf_counter() - start
    return {
        "loader": run["loader"],
        "device": str(device),
        "batch_size": run["per_gpu_batch"],
        "num_workers": run["num_workers"] if run["loader"] == "dataloader" else 0,
        "batches": batches,
        "first_batch_s": first_s,
        "seconds": elapsed,
        "images_per_s": images_seen / elapsed,
    }


def checkpoint_bandwidth(run: dict[str, Any], repeats: int, directory: str) -> dict[str, Any]:
    """Size and write/read bandwidth of the real model's checkpoint on the checkpoint filesystem."""
    import torch  # torch only in the job (train.optim and the checkpoint format import it too)

    from scalestudy.train import optim
    from scalestudy.train.checkpoint import single_file as checkpoint

    full = _full(run)
    net = workloads.get(full["workload"]).runtime_module().build_model(full, torch.device("cpu")).model
    optimizer = optim.build_optimizer(net, optim.OptimizerSettings.from_config(full), 0.0, sharded=False)
    for parameter in net.parameters():  # one step at lr 0: the state a trained optimizer holds
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    state = {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "run_config": run}
    shutil.rmtree(directory, ignore_errors=True)
    writes, reads, size = [], [], 0
    try:
        for repeat in range(repeats):
            start = time.perf_counter()
            path = checkpoint.save(directory, state, step=repeat + 1, keep=1)
            writes.append(time.perf_counter() - start)
            size = path.stat().st_size
            _drop_from_page_cache(path)
            start = time.perf_counter()
            if checkpoint.load_latest(directory) is None:
                raise SmokeFailure(f"the checkpoint just written to {directory} does not load back")
            reads.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    write_s, read_s = _median(writes), _median(reads)
    return {
        "directory": directory,
        "bytes": size,
        "repeats": repeats,
        "write_s": write_s,
        "read_s": read_s,
        "write_mb_s": size / write_s / 1e6,
        "read_mb_s": size / read_s / 1e6,
        "read_note": "page cache dropped before each read (posix_fadvise DONTNEED, a hint)",
    }


def _drop_from_page_cache(path: Path) -> None:
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def check_loader(result: dict[str, Any], minimum: float | None) -> None:
    if minimum is not None and result["images_per_s"] < minimum:
        raise SmokeFailure(
            f"the {result['loader']} loader delivers {result['images_per_s']:.0f} images/s per rank on "
            f"{result['device']}, below smoke.loader_min_images_per_s={minimum:g}: training would wait "
            "for data (more num_workers, loader: tensor, or a faster filesystem)"
        )


def run_io(run: dict[str, Any], settings: dict[str, Any], epoch: dict[str, Any]) -> dict[str, Any]:
    loader_result = loader_throughput(run, settings["loader_batches"])
    log.info(
        "loader %s: %.0f images/s per rank over %d batches of %d on %s (first batch %.2f s)",
        loader_result["loader"],
        loader_result["images_per_s"],
        loader_result["batches"],
        loader_result["batch_size"],
        loader_result["device"],
        loader_result["first_batch_s"],
    )
    loader_result["min_images_per_s"] = settings["loader_min_images_per_s"]
    check_loader(loader_result, settings["loader_min_images_per_s"])
    saved = checkpoint_bandwidth(run, settings["checkpoint_repeats"], f"{CHECKPOINTS}/io")
    saved |= epoch | {"save_s_per_epoch": saved["write_s"] * epoch["saves_per_epoch"]}
    log.info(
        "checkpoint: %.1f MB, write %.0f MB/s, read %.0f MB/s; %d saves per epoch cost %.2f s",
        saved["bytes"] / 1e6,
        saved["write_mb_s"],
        saved["read_mb_s"],
        epoch["saves_per_epoch"],
        saved["save_s_per_epoch"],
    )
    return {"check": "io", "ok": True, "loader": loader_result, "checkpoint": saved}


# --------------------------------------------------------------------------- step: the real trainer


def with_nccl_debug(spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """NCCL_DEBUG=INFO for the ranks (whatever nccl: sets) unless they run on the CPU (gloo)."""
    if run["device"] == "cpu":
        return spec
    return {**spec, "env": {**spec.get("env", {}), "NCCL_DEBUG": "INFO"}}


def nccl_lines(lines: Sequence[str], limit: int = 40) -> list[str]:
    kept = [line.strip() for line in lines if "NCCL INFO" in line and any(k in line for k in NCCL_KEEP)]
    return kept[:limit]


def run_step(spec: dict[str, Any], run: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Run the trainer for the smoke steps; its output goes to this process's stderr (the log)."""
    shutil.rmtree(run["checkpoint_dir"], ignore_errors=True)
    spec = with_nccl_debug(spec, run)
    trainer_args = ["--run-config-json", json.dumps(run, sort_keys=True), "--out-dir", out_dir]
    started = time.perf_counter()
    code, lines = common.run_logged(common.launch_argv(spec, trainer_args))
    wall = time.perf_counter() - started
    shutil.rmtree(run["checkpoint_dir"], ignore_errors=True)
    if code != 0:
        raise SmokeFailure(
            f"the training step at world size {run['world_size']} failed (trainer exit {code}) after "
            f"{wall:.0f} s; its output is above"
        )
    summary = json.loads((Path(out_dir) / runfiles.SUMMARY).read_text())
    results = summary["results"]
    return {
        "check": "step",
        "ok": True,
        "world_size": run["world_size"],
        "wall_s": wall,
        "steps": results["steps"],
        # a few steps fill no steady-state window: the trainer's whole-run rates then
        "step_time_s": results.get("step_time_s") or results.get("whole_run_step_time_s"),
        "images_per_s": results.get("images_per_s") or results.get("whole_run_images_per_s"),
        "backend": results["backend"],
        "device": results["device"],
        "device_name": results["device_name"],
        "hosts": summary["provenance"].get("hosts"),
        "nccl_debug": spec["env"].get("NCCL_DEBUG"),
        "nccl_lines": nccl_lines(lines),
    }


# --------------------------------------------------------------------------- table


def table_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    if record["check"] == "step":
        detail = f"{record['backend']} on {record['device_name']}; hosts {', '.join(record['hosts'] or [])}"
        return [
            _table_row("training step", record["world_size"], record["step_time_s"], "s", detail),
            _table_row("training throughput", record["world_size"], record["images_per_s"], "images/s", ""),
        ]
    loader_result, saved = record["loader"], record["checkpoint"]
    target = loader_result["min_images_per_s"]
    loader_detail = (
        f"{loader_result['loader']}, batch {loader_result['batch_size']}, {loader_result['device']}"
    )
    loader_detail += f"; target {target:g}" if target is not None else "; no target configured"
    return [
        _table_row("loader alone, per rank", 1, loader_result["images_per_s"], "images/s", loader_detail),
        _table_row("checkpoint size", 1, saved["bytes"] / 1e6, "MB", saved["directory"]),
        _table_row("checkpoint write", 1, saved["write_mb_s"], "MB/s", f"median of {saved['repeats']}"),
        _table_row("checkpoint read", 1, saved["read_mb_s"], "MB/s", saved["read_note"]),
        _table_row(
            "checkpoint saves per epoch",
            1,
            saved["save_s_per_epoch"],
            "s",
            f"{saved['saves_per_epoch']} saves ({saved['steps_per_epoch']} steps, every "
            f"{saved['checkpoint_every_steps']})",
        ),
    ]


def _table_row(check, world, value, unit, detail) -> dict[str, Any]:
    shown = f"{value:.4g}" if isinstance(value, int | float) else "n/a"
    return dict(zip(TABLE_COLUMNS, (check, world, shown, unit, detail), strict=True))


# --------------------------------------------------------------------------- command line


def _table(args: argparse.Namespace) -> int:
    records = common.read_records(args.inputs)
    common.write_table(args.out, TABLE_COLUMNS, (row for record in records for row in table_rows(record)))
    return 0


def _check(args: argparse.Namespace) -> int:
    """`io` or `step`: the record, with the run config and provenance, to --out; a failure exits 1."""
    run = json.loads(args.run_config_json)
    try:
        if args.command == "io":
            record = run_io(run, json.loads(args.settings_json), json.loads(args.epoch_json))
        else:
            record = run_step(json.loads(args.launch_json), run, args.out_dir)
    except SmokeFailure as failure:
        log.error("smoke test failed: %s", failure)
        return EXIT_FAILED
    common.write_record(args.out, {**record, "run_config": run}, config=run, seed=run.get("seed"))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser, sub = common.command_parser("smoke", __doc__)
    io_parser = sub.add_parser("io", help="loader throughput and checkpoint bandwidth")
    io_parser.add_argument("--settings-json", required=True, help="the config's smoke: section")
    io_parser.add_argument("--epoch-json", required=True, help="saves per epoch (saves_per_epoch())")
    step = sub.add_parser("step", help="a few training steps through scalestudy.launch.launcher")
    common.add_launch_json(step, "the training jobs' at this world size")
    step.add_argument("--out-dir", required=True, help="the trainer's run folder")
    for p in (io_parser, step):
        p.add_argument("--run-config-json", required=True)
        common.add_out(p, "the smoke result (JSON)")
    common.add_table_command(sub, "--inputs", "the smoke results (JSON)", "results/tables/smoke.csv")
    handlers = {"io": _check, "step": _check, "table": _table}
    return common.run_command(parser.parse_args(argv), handlers, "smoke")


if __name__ == "__main__":
    raise SystemExit(main())
