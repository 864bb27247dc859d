"""The communication model against the measurements: efficiency vs GPUs up to comm_model.max_world."""

from __future__ import annotations

import pandas as pd

from scalestudy.analysis import series
from scalestudy.analysis.commpredict import FIT_CURVE
from scalestudy.plots import scaling as scaling_plots
from scalestudy.plots import style

CURVE_COLOURS = style.PALETTE[2:]


def fit_summary(fit: pd.DataFrame) -> str:
    """One line on how far to trust the black curve: method, points, dof, RMS residual."""
    value = fit.set_index("quantity")["value"]
    points, dof = value.get("points", "?"), value.get("degrees_of_freedom", "?")
    text = f"Fit: {value.get('method', '?')}; {points} points, dof {dof}"
    rms = pd.to_numeric(pd.Series([value.get("rms_residual")]), errors="coerce").iloc[0]
    return text + (f"; RMS residual {rms:.3g} ms per step" if pd.notna(rms) else "")


def model_vs_measurement(
    prediction: pd.DataFrame, scaling: pd.DataFrame, png, pdf=None, fit: pd.DataFrame | None = None
) -> None:
    """One panel per mode: measured efficiency (with CI) and the predicted curves; `fit` adds a line
    saying how the model was fitted. The model is DDP's all-reduce: FSDP rows are not drawn."""
    ddp = series.parallelism_of(scaling).eq(series.DDP)
    modes = sorted(set(scaling["mode"]) | set(prediction.get("mode", pd.Series(dtype=str))))
    fig, axes = style.new_figure(wide=True, aspect=0.36, ncols=max(len(modes), 1))
    curves = [c for c in prediction.get("curve", pd.Series(dtype=str)).unique() if c != FIT_CURVE]
    colours = dict(zip(curves, CURVE_COLOURS, strict=False))
    max_world = int(
        max(prediction["world_size"].max() if len(prediction) else 2, scaling["world_size"].max())
    )
    for ax, mode in zip(axes[0], modes, strict=True):
        _predicted(ax, prediction[prediction["mode"] == mode] if len(prediction) else prediction, colours)
        measured = scaling[(scaling["mode"] == mode) & ddp].sort_values("world_size")
        s = style.mode_style(mode)
        style.errorbar(
            ax,
            measured["world_size"],
            measured["efficiency_mean"],
            measured["efficiency_ci_low"],
            measured["efficiency_ci_high"],
            color=s["color"],
            marker=s["marker"],
            linestyle="none",
            label=f"measured ({mode})",
            zorder=5,
        )
        ax.axvspan(
            measured["world_size"].min(),
            measured["world_size"].max(),
            color="0.9",
            zorder=0,
            label="measured range",
        )
        style.sparse_world_ticks(ax, max_world)
        ax.set_xlabel(style.world_label())
        scaling_plots.above_ideal_rings(ax, measured)
        ax.set_ylim(0.0, scaling_plots.efficiency_top(measured))
        style.percent_axis(ax)
        ax.set_title(s["label"])
    axes[0, 0].set_ylabel("Parallel efficiency")
    legend = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", ncols=3)
    if fit is not None and len(fit):
        fig.suptitle(fit_summary(fit), fontsize=6, color="0.3")
    style.save_figure(fig, png, pdf)


def _predicted(ax, prediction: pd.DataFrame, colours: dict) -> None:
    if prediction.empty:
        return
    for curve, group in prediction.groupby("curve", sort=False):
        group = group.sort_values("world_size")
        if curve == FIT_CURVE:
            ax.plot(group["world_size"], group["efficiency"], color="black", linewidth=1.2, label=curve)
        else:
            ax.plot(
                group["world_size"],
                group["efficiency"],
                color=colours[curve],
                linewidth=1.0,
                linestyle="--",
                label=curve,
            )
