# aggregate: every run's summary -> the run catalog; metrics, acceptance, the communication model,
# the scaling-loss waterfall and the resource estimate. The logic is in scalestudy.analysis; each rule calls one module.

ANALYSIS_LOGS = f"{paths.LOGS_DIR}/analysis"
RUN_SUMMARIES = [path for stage in grid.STAGES for path in run_files(stage, runfiles.SUMMARY)]
provide("run_summaries", RUN_SUMMARIES)


rule table_accounting:
    input:
        summaries=RUN_SUMMARIES,
    output:
        f"{TABLES_DIR}/sacct.json",
    log:
        f"{ANALYSIS_LOGS}/accounting.log",
    conda:
        SOFTWARE_ENV
    # Outside the container (sacct and the Slurm libraries are on the host, not in the image) and,
    # as a table_* rule, on the submit host (cluster.submit_host_rules), where sacct answers.
    # Standard library only; where sacct is missing or disabled the JSON says so and the run still succeeds.
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.analysis.accounting --summaries {input.summaries:q} --out {output:q} > {log:q} 2>&1"


# The run catalog, and how the study ran in the report's words (its executor; Slurm's version where
# Slurm ran it: scalestudy.analysis.execution), which report/*.rst include: one job writes both, so
# that every report holding the catalog or a table made from it can include the words.
rule table_runs:
    input:
        image=image_input(),
        summaries=RUN_SUMMARIES,
        accounting=rules.table_accounting.output[0],
        system=rules.table_system.output[0],
    output:
        runs=table_report("runs.csv", "Acceptance", "Run catalog"),
        execution=paths.REPORT_TEXT,
    log:
        f"{ANALYSIS_LOGS}/runs.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "(python -m scalestudy.analysis.aggregate --summaries {input.summaries:q}"
        " --accounting {input.accounting:q} --out {output.runs:q}"
        " && python -m scalestudy.analysis.execution --runs {output.runs:q} --system {input.system:q}"
        " --out {output.execution:q}) > {log:q} 2>&1"


rule table_metrics:
    input:
        image=image_input(),
        runs=rules.table_runs.output.runs,
    output:
        scaling=table_report("scaling.csv", "Scaling", "Tables"),
        sensitivity=table_report("sensitivity.csv", "Sensitivity", "Tables"),
    log:
        f"{ANALYSIS_LOGS}/metrics.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        analysis=analysis_json("confidence", "train_flops_factor", "peak_tflops", "comm_model"),
        axes=SENSITIVITY_AXES,
        sample_unit=WORKLOAD.sample_unit,  # for the captions
        unit=PLOT_UNIT,
    shell:
        "python -m scalestudy.analysis.metrics --runs {input.runs:q} --analysis-json {params.analysis:q}"
        " --scaling-out {output.scaling:q} --sensitivity-out {output.sensitivity:q} --axes {params.axes:q}"
        " > {log:q} 2>&1"


rule table_acceptance:
    input:
        image=image_input(),
        scaling=rules.table_metrics.output.scaling,
        sensitivity=rules.table_metrics.output.sensitivity,
        monitor=run_files("scaling", runfiles.GPU_MONITOR),
        busbw=rules.table_comm_bench.output.busbw,
        loader_smoke=provided("loader_smoke"),  # none for a command workload (rules/smoke.smk)
    output:
        csv=f"{TABLES_DIR}/acceptance.csv",
        html=table_report("acceptance.html", "Acceptance", "Criteria"),
    log:
        f"{ANALYSIS_LOGS}/acceptance.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        analysis=analysis_json("acceptance", "monitor"),
        loader_smoke=lambda wc, input: ["--loader-smoke", *input.loader_smoke] if input.loader_smoke else [],
    shell:
        "python -m scalestudy.analysis.acceptance --scaling {input.scaling:q}"
        " --sensitivity {input.sensitivity:q} --monitor {input.monitor:q} --analysis-json {params.analysis:q}"
        " --busbw {input.busbw:q} {params.loader_smoke:q}"
        " --out {output.csv:q} --html {output.html:q} > {log:q} 2>&1"


rule table_comm_model:
    input:
        image=image_input(),
        runs=rules.table_runs.output.runs,
        bench_fit=rules.table_comm_bench.output.fit,
        profile_overlap=rules.profile_combine.output.overlap,
    output:
        fit=table_report("comm_model_fit.csv", "Model", "Tables"),
        residuals=table_report("comm_model_residuals.csv", "Model", "Tables"),
        prediction=f"{TABLES_DIR}/comm_model_prediction.csv",
    log:
        f"{ANALYSIS_LOGS}/comm_model.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        analysis=analysis_json("comm_model"),
    shell:
        "python -m scalestudy.analysis.commmodel --runs {input.runs:q} --analysis-json {params.analysis:q}"
        " --fit-out {output.fit:q} --residuals-out {output.residuals:q}"
        " --prediction-out {output.prediction:q} --bench-fit {input.bench_fit:q}"
        " --profile-overlap {input.profile_overlap:q} > {log:q} 2>&1"


rule table_waterfall:
    input:
        image=image_input(),
        runs=rules.table_runs.output.runs,
        comm_fit=rules.table_comm_model.output.fit,
        bench_fit=rules.table_comm_bench.output.fit,
        profile_overlap=rules.profile_combine.output.overlap,
    output:
        csv=table_report("waterfall.csv", "Scaling", "Tables"),
    log:
        f"{ANALYSIS_LOGS}/waterfall.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        # metrics.run_metrics reads monitor, peak_tflops and train_flops_factor; the model comm_model
        analysis=analysis_json("comm_model", "monitor", "peak_tflops", "train_flops_factor", "waterfall"),
    shell:
        "python -m scalestudy.analysis.waterfall --runs {input.runs:q} --analysis-json {params.analysis:q}"
        " --comm-fit {input.comm_fit:q} --bench-fit {input.bench_fit:q}"
        " --profile-overlap {input.profile_overlap:q} --out {output.csv:q} > {log:q} 2>&1"


rule table_resources:
    input:
        image=image_input(),
        runs=rules.table_runs.output.runs,
        scaling=rules.table_metrics.output.scaling,
        prediction=rules.table_comm_model.output.prediction,
    output:
        csv=table_report("resource_estimate.csv", "Acceptance", "Resource estimate"),
    log:
        f"{ANALYSIS_LOGS}/resources.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        analysis=analysis_json("resources", "comm_model"),
    shell:
        "python -m scalestudy.analysis.resources --runs {input.runs:q} --scaling {input.scaling:q}"
        " --prediction {input.prediction:q} --analysis-json {params.analysis:q}"
        " --out {output.csv:q} > {log:q} 2>&1"


provide(
    "analysis",
    [
        *rules.table_accounting.output,
        rules.table_runs.output.runs,
        *rules.table_metrics.output,
        *rules.table_acceptance.output,
        *rules.table_comm_model.output,
        *rules.table_waterfall.output,
        *rules.table_resources.output,
    ],
)
