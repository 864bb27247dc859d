"""Draw one figure: `python -m scalestudy.plots <figure> --png OUT.png [--pdf OUT.pdf] <inputs>`.

Figures: throughput, efficiency, epoch-time, memory, energy (from scaling.csv), sensitivity
(sensitivity.csv), accuracy (the quality curves of the scaling runs' metrics.csv: test accuracy, or
the losses and perplexity of an LM, by --metric), monitor (their gpu_monitor.csv), comm-model
(comm_model_prediction.csv + scaling.csv), comm-busbw (results/comm/busbw.csv), waterfall (the
scaling-loss waterfall, waterfall.csv). Thresholds come
from the analysis settings; the throughput unit (images, tokens, ...) from the tables' sample_unit.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from scalestudy.analysis import cli
from scalestudy.analysis.metrics import DEFAULT_AXES
from scalestudy.analysis.tableio import read_csv
from scalestudy.plots import style

log = logging.getLogger("scalestudy.plots")

SCALING_COLUMNS = ("mode", "world_size", "efficiency_mean", "efficiency_ci_low", "efficiency_ci_high")


def _scaling(args):
    stems = ("images_per_s", "efficiency", "epoch_time_s")
    return read_csv(
        args.scaling,
        ["mode", "world_size"] + [f"{s}_{k}" for s in stems for k in ("mean", "ci_low", "ci_high")],
    )


def _throughput(args, settings):
    from scalestudy.plots import scaling

    scaling.throughput(_scaling(args), args.png, args.pdf)


def _efficiency(args, settings):
    from scalestudy.plots import scaling

    scaling.efficiency(_scaling(args), args.png, args.pdf, settings["acceptance"])


def _epoch_time(args, settings):
    from scalestudy.plots import scaling

    scaling.epoch_time(_scaling(args), args.png, args.pdf)


def _memory(args, settings):
    from scalestudy.plots import memory

    memory.memory(read_csv(args.scaling, ["mode", "world_size"]), args.png, args.pdf)


def _energy(args, settings):
    from scalestudy.plots import energy

    energy.figure(read_csv(args.scaling, ["mode", "world_size"]), args.png, args.pdf)


def _sensitivity(args, settings):
    from scalestudy.plots import sensitivity

    table = read_csv(args.sensitivity, [*args.axes, "images_per_s_per_gpu", "world_size"])
    sensitivity.heatmaps(table, args.png, args.pdf, args.axes, args.rows, args.cols)


def _accuracy(args, settings):
    from scalestudy.plots import curves

    target = args.target_accuracy if args.metric == "accuracy" else None
    curves.quality(curves.load_curves(args.metrics), args.png, args.pdf, args.metric, target)


def _monitor(args, settings):
    from scalestudy.analysis import monitor_window
    from scalestudy.plots import monitor

    samples, reasons = monitor_window.load(monitor.select(args.monitor))
    monitor.timelines(samples, args.png, args.pdf, settings["monitor"], reasons)


def _comm_model(args, settings):
    from scalestudy.plots import comm_model as model

    prediction = read_csv(args.prediction, ["mode", "curve", "world_size", "efficiency"])
    fit = read_csv(args.fit, ["quantity", "value"]) if args.fit else None
    model.model_vs_measurement(prediction, read_csv(args.scaling, SCALING_COLUMNS), args.png, args.pdf, fit)


def _comm_busbw(args, settings):
    from scalestudy.plots import comm_busbw as commbench

    busbw = read_csv(args.busbw, ["collective", "world_size", "placement", "bytes", "time_s", "busbw_gb_s"])
    commbench.busbw_figure(busbw, args.png, args.pdf, args.bucket_mb)


def _waterfall(args, settings):
    from scalestudy.analysis.waterfall import COLUMNS
    from scalestudy.plots import waterfall

    waterfall.waterfall(read_csv(args.waterfall, COLUMNS), args.png, args.pdf)


FIGURES = {
    "throughput": (_throughput, ("scaling",)),
    "efficiency": (_efficiency, ("scaling",)),
    "epoch-time": (_epoch_time, ("scaling",)),
    "memory": (_memory, ("scaling",)),
    "energy": (_energy, ("scaling",)),
    "sensitivity": (_sensitivity, ("sensitivity", "axes", "rows", "cols")),
    "accuracy": (_accuracy, ("metrics", "target_accuracy", "metric")),
    "monitor": (_monitor, ("monitor",)),
    "comm-model": (_comm_model, ("prediction", "scaling", "fit")),
    "comm-busbw": (_comm_busbw, ("busbw", "bucket_mb")),
    "waterfall": (_waterfall, ("waterfall",)),
}
INPUTS = {
    "scaling": {"help": "scaling.csv (scalestudy.analysis.metrics)."},
    "sensitivity": {"help": "sensitivity.csv (scalestudy.analysis.metrics)."},
    "prediction": {"help": "comm_model_prediction.csv (scalestudy.analysis.commmodel)."},
    "fit": {"help": "comm_model_fit.csv: states the fit method on the figure (optional)."},
    "metrics": {"nargs": "*", "default": [], "help": "metrics.csv of the scaling runs."},
    "monitor": {"nargs": "*", "default": [], "help": "gpu_monitor.csv of the scaling runs."},
    "target_accuracy": {"type": float, "help": "Draw the target test accuracy (metric accuracy)."},
    "metric": {
        "choices": ("accuracy", "perplexity", "none"),
        "default": "accuracy",
        "help": "The workload's metric: accuracy curves, or the losses (and perplexity).",
    },
    "axes": {
        "nargs": "+",
        "default": list(DEFAULT_AXES),
        "help": "The sweep's axes (sensitivity.axes keys, in order).",
    },
    "rows": {"help": "The axis along the heatmap's rows (default: the last axis but one)."},
    "cols": {"help": "The axis along the heatmap's columns (default: the last axis)."},
    "busbw": {"help": "results/comm/busbw.csv (scalestudy.preflight.collectives)."},
    "waterfall": {"help": "waterfall.csv (scalestudy.analysis.waterfall)."},
    "bucket_mb": {"type": float, "nargs": "*", "default": [], "help": "DDP bucket sizes (MiB) to mark."},
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.plots", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="figure", required=True)
    for name, (_, inputs) in FIGURES.items():
        p = sub.add_parser(name, help=f"the {name} figure")
        p.add_argument("--png", required=True, help="PNG to write (report).")
        p.add_argument("--pdf", help="Vector PDF to write (paper).")
        p.add_argument("--log-level", default="INFO")
        p.add_argument("--unit", default="GPU", help="what one rank drives, in labels: GPU or rank (CPU)")
        group = p.add_mutually_exclusive_group()
        group.add_argument("--analysis-json", help="The config's analysis: section as JSON.")
        group.add_argument("--config", help="A study config file (YAML).")
        for key in inputs:
            p.add_argument(f"--{key.replace('_', '-')}", **INPUTS[key])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = cli.start(args)
    style.set_unit(args.unit)
    FIGURES[args.figure][0](args, settings)
    log.info("%s -> %s%s", args.figure, args.png, f", {args.pdf}" if args.pdf else "")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
