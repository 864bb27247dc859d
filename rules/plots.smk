# plots: every figure of the study, PNG for the report (with its caption report/<name>.rst) and vector
# PDF for the paper (results/paper/figures/). Drawing is in scalestudy.plots (one style module); the
# rules differ only in inputs, so they are generated from one table: figure_<name>.

PLOT_LOGS = f"{paths.LOGS_DIR}/plots"


# Labels say what one rank drives (PLOT_UNIT, rules/common/values.smk) and what throughput counts.
SCALING_TABLE = {"scaling": rules.table_metrics.output.scaling}
# The DDP bucket sizes the runs use: the sweep's (sensitivity.axes.bucket_cap_mb; before the axes
# existed, sensitivity.bucket_cap_mb), else the one of train.bucket_cap_mb.
SWEPT_BUCKET_SIZES = (
    (config["sensitivity"].get("axes") or {}).get("bucket_cap_mb")
    or config["sensitivity"].get("bucket_cap_mb")
    or [config["train"]["bucket_cap_mb"]]
)

FIGURES = {
    "throughput": Figure("Scaling", "throughput", SCALING_TABLE),
    "efficiency": Figure("Scaling", "efficiency", SCALING_TABLE, sections=("acceptance",)),
    "epoch_time": Figure("Scaling", "epoch-time", SCALING_TABLE),
    "memory": Figure("Scaling", "memory", SCALING_TABLE),
    # time to accuracy against energy against GPU count (scaling.csv's energy columns)
    "energy": Figure("Scaling", "energy", SCALING_TABLE),
    # the quality curves: test accuracy (the ResNet), or the losses and perplexity (an LM)
    "accuracy": Figure(
        "Scaling",
        "accuracy",
        {"metrics": run_files("scaling", runfiles.METRICS)},
        extra=f"--target-accuracy {config['train']['target_accuracy']} --metric {WORKLOAD.metric}",
    ),
    "sensitivity": Figure(
        "Sensitivity",
        "sensitivity",
        {"sensitivity": rules.table_metrics.output.sensitivity},
        extra=" ".join(["--axes", *map(shlex.quote, SENSITIVITY_AXES)]),
    ),
    "gpu_monitor": Figure(
        "Monitoring",
        "monitor",
        {"monitor": run_files("scaling", runfiles.GPU_MONITOR)},
        sections=("monitor",),
    ),
    "comm_model": Figure(
        "Model",
        "comm-model",
        {
            "prediction": rules.table_comm_model.output.prediction,
            "fit": rules.table_comm_model.output.fit,
            **SCALING_TABLE,
        },
    ),
    "comm_busbw": Figure(
        "Model",
        "comm-busbw",
        {"busbw": rules.table_comm_bench.output.busbw},
        extra=" ".join(["--bucket-mb", *map(str, SWEPT_BUCKET_SIZES)]),
    ),
    # the scaling-loss waterfall: each point's lost efficiency in its parts
    "waterfall": Figure("Scaling", "waterfall", {"waterfall": rules.table_waterfall.output.csv}),
}


for _name, _figure in FIGURES.items():

    rule:
        name:
            f"figure_{_name}"
        input:
            **_figure.inputs,
            image=image_input(),
        output:
            png=report(
                f"{paths.FIGURES_DIR}/{_name}.png",
                caption=f"../report/{_name}.rst",
                category=_figure.category,
                subcategory="Figures",
            ),
            pdf=f"{paths.PAPER_FIGURES_DIR}/{_name}.pdf",
        log:
            f"{PLOT_LOGS}/{_name}.log",
        conda:
            SOFTWARE_ENV
        container:
            container_image()
        resources:
            **light_resources(),
        params:
            figure=_figure.command,
            inputs=input_args(tuple(_figure.inputs)),
            extra=_figure.extra,
            analysis=analysis_json(*_figure.sections),
            unit=PLOT_UNIT,
            # for the captions (report/<name>.rst): what throughput counts and what the study trains
            sample_unit=WORKLOAD.sample_unit,
            workload=WORKLOAD.name,
            metric=WORKLOAD.metric,
        shell:
            "python -m scalestudy.plots {params.figure} {params.inputs} {params.extra}"
            " --unit {params.unit:q} --analysis-json {params.analysis:q} --png {output.png:q} --pdf {output.pdf:q} > {log:q} 2>&1"


provide("figures", [path for name in FIGURES for path in getattr(rules, f"figure_{name}").output])
