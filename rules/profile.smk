# profile: where a training step's time goes. Per profiled world size one training run of the
# profile point under Nsight Systems (one report per rank, nsys inside srun) or, where nsys or a GPU
# is missing (tool auto) or asked for (tool torch), the torch.profiler fallback; the tool actually
# used is recorded in the run folder (profile_tool.json). Nsight Compute profiles the top kernels of
# a one-GPU run: those with the most GPU time in the profile run of that point (nsys's summary where
# nsys ran, else the torch profiler's kernel table, the loader's left out), inside the trainer's
# NVTX step ranges of the steady-state window and outside its data ranges
# (scalestudy/profiling/kernel_choice.py). Everything is parsed into one summary schema
# (scalestudy/profiling/schema.py).
# Config strings reach params only through params functions: Snakemake formats a params string for
# wildcards (a regex such as `gemm.{0,4}` would be taken for one), never a function's value.

from scalestudy.profiling import kernel_choice
from scalestudy.profiling import ncu as ncu_tool

PROFILE_DIR = paths.PROFILE_DIR
PROFILE_RUN_DIR = STAGE_PATTERNS["profile"]
PROFILE_LOGS = f"{paths.LOGS_DIR}/profile"
PROFILE_TABLES = ("breakdown", "top_kernels", "overlap")
PROFILE_FIGURES = ("profile_breakdown", "profile_top_kernels", "profile_ncu_throughput")
NCU = config["profiling"]["ncu"]
ncu_tool.check_settings(NCU)
NCU_WORLD = 1  # Nsight Compute profiles a one-GPU run
# The profile ncu takes its top kernels from: the one-GPU profile run's record (which tool ran) and
# its nsys summary (an empty folder where torch.profiler ran), if that point is profiled and no
# kernel_regex decides. As inputs they make the ncu job wait for the run it reads.
NCU_READS_PROFILE = NCU_WORLD in PROFILE_WORLDS and not NCU["kernel_regex"]
NCU_PROFILE_RECORD = (
    [f"{STAGE_PATTERNS['profile'].format(world=NCU_WORLD)}/profile_tool.json"] if NCU_READS_PROFILE else []
)
NCU_NSYS_STATS = [f"{PROFILE_DIR}/w{NCU_WORLD}/nsys_stats"] if NCU_READS_PROFILE else []


# Each figure: the PNG for the report (caption report/<name>.rst), the vector PDF for the paper.
PROFILE_FIGURE_FILES = {
    name: {"png": f"{paths.FIGURES_DIR}/{name}.png", "pdf": f"{paths.PAPER_FIGURES_DIR}/{name}.pdf"}
    for name in PROFILE_FIGURES
}
NCU_FILES = {
    "status": f"{PROFILE_DIR}/w{{world}}/ncu_status.json",
    "kernels": f"{PROFILE_DIR}/w{{world}}/ncu_kernels.csv",
    "raw": f"{PROFILE_DIR}/w{{world}}/ncu_raw.csv",
}
NCU_TARGETS = {key: path.format(world=NCU_WORLD) for key, path in NCU_FILES.items()} if NCU["enabled"] else {}
# Where the ncu figure reads from, or why there is nothing to read.
NCU_FIGURE_SOURCE = (
    ["--status", NCU_TARGETS["status"], "--kernels", NCU_TARGETS["kernels"]]
    if NCU["enabled"]
    else ["--not-run", "disabled in the config (profiling.ncu.enabled: false)"]
)


rule profile_run:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        gate=after_training_gate,
        compiled=compile_input("profile"),
    output:
        **run_outputs("profile"),
        record=f"{PROFILE_RUN_DIR}/profile_tool.json",
    log:
        run_log("profile"),
    benchmark:
        run_benchmark("profile")
    # No container: here: scalestudy.launch.launcher puts the image (and nsys) around each rank.
    conda:
        SOFTWARE_ENV
    threads: train_threads("profile")
    resources:
        **train_resources("profile"),
    params:
        **run_params("profile"),
    shell:
        "python -m scalestudy.profiling.run --launch-json {params.launch:q}"
        " --run-config-json {params.run:q} --out-dir {params.out_dir:q} --record {output.record:q}"
        " --log {log:q} --attempt {resources.attempt} > {log:q} 2>&1"


rule profile_nsys_stats:
    input:
        record=rules.profile_run.output.record,
        image=image_input(),
    output:
        directory(f"{PROFILE_DIR}/w{{world}}/nsys_stats"),
    log:
        f"{PROFILE_LOGS}/w{{world}}_nsys_stats.log",
    group:
        short_job_group("profile_nsys_stats")
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **grouped_resources("profile_nsys_stats", light_resources()),
    shell:
        "python -m scalestudy.profiling.nsys export --record {input.record:q} --out-dir {output:q}"
        " > {log:q} 2>&1"


rule profile_summary:
    input:
        record=rules.profile_run.output.record,
        summary=rules.profile_run.output.summary,
        nsys_stats=rules.profile_nsys_stats.output[0],
        image=image_input(),
    output:
        **{name: f"{PROFILE_DIR}/w{{world}}/{name}.csv" for name in PROFILE_TABLES},
    log:
        f"{PROFILE_LOGS}/w{{world}}_summary.log",
    group:
        short_job_group("profile_summary")
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **grouped_resources("profile_summary", light_resources()),
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.breakdown),
        top=15,
    shell:
        "python -m scalestudy.profiling.summarize world --record {input.record:q}"
        " --nsys-stats {input.nsys_stats:q} --out-dir {params.out_dir:q} --top {params.top:q}"
        " > {log:q} 2>&1"


rule profile_combine:
    input:
        **{
            name: expand(f"{PROFILE_DIR}/w{{world}}/{name}.csv", world=PROFILE_WORLDS)
            for name in PROFILE_TABLES
        },
        image=image_input(),
    output:
        **{name: f"{PROFILE_DIR}/{name}.csv" for name in PROFILE_TABLES},
    log:
        f"{PROFILE_LOGS}/combine.log",
    group:
        short_job_group("profile_combine")
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **grouped_resources("profile_combine", light_resources()),
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.breakdown),
        world_dirs=lambda wildcards, input: [os.path.dirname(path) for path in input.breakdown],
    shell:
        "python -m scalestudy.profiling.summarize combine --out-dir {params.out_dir:q}"
        " {params.world_dirs:q} > {log:q} 2>&1"


rule profile_ncu:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        gate=after_training_gate,
        compiled=compile_input("profile"),
        profile_record=NCU_PROFILE_RECORD,
        nsys_stats=NCU_NSYS_STATS,
    output:
        **NCU_FILES,
    log:
        f"{PROFILE_LOGS}/w{{world}}_ncu.log",
    wildcard_constraints:
        world=str(NCU_WORLD),
    conda:
        SOFTWARE_ENV
    threads: train_threads("profile")
    resources:
        **train_resources("profile"),
    params:
        run=run_params("profile")["run"],
        launch=run_params("profile")["launch"],
        work_dir=lambda wildcards, output: os.path.join(os.path.dirname(output.status), "ncu_run"),
        # --kernel-regex (when configured), --profile-record and --nsys-stats (the w1 profile run),
        # --top-kernels, --launch-count, --loader-kernels (when configured)
        selection=lambda wildcards, input: kernel_choice.selection_args(
            NCU, input.profile_record, input.nsys_stats
        ),
    shell:
        "python -m scalestudy.profiling.ncu run --launch-json {params.launch:q}"
        " --run-config-json {params.run:q} --work-dir {params.work_dir:q} {params.selection:q}"
        " --status {output.status:q}"
        " --kernels {output.kernels:q} --raw {output.raw:q} --log {log:q} --attempt {resources.attempt}"
        " > {log:q} 2>&1"


rule figure_profile_breakdown:
    input:
        breakdown=rules.profile_combine.output.breakdown,
        image=image_input(),
    output:
        png=report(
            PROFILE_FIGURE_FILES["profile_breakdown"]["png"],
            caption="../report/profile_breakdown.rst",
            category="Profiling",
            subcategory="Figures",
        ),
        pdf=PROFILE_FIGURE_FILES["profile_breakdown"]["pdf"],
    log:
        f"{PROFILE_LOGS}/figure_breakdown.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.profiling.figures breakdown --breakdown {input.breakdown:q}"
        " --png {output.png:q} --pdf {output.pdf:q} > {log:q} 2>&1"


rule figure_profile_top_kernels:
    input:
        top_kernels=rules.profile_combine.output.top_kernels,
        image=image_input(),
    output:
        png=report(
            PROFILE_FIGURE_FILES["profile_top_kernels"]["png"],
            caption="../report/profile_top_kernels.rst",
            category="Profiling",
            subcategory="Figures",
        ),
        pdf=PROFILE_FIGURE_FILES["profile_top_kernels"]["pdf"],
    log:
        f"{PROFILE_LOGS}/figure_top_kernels.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.profiling.figures top-kernels --top-kernels {input.top_kernels:q}"
        " --png {output.png:q} --pdf {output.pdf:q} > {log:q} 2>&1"


rule figure_profile_ncu:
    input:
        **NCU_TARGETS,
        image=image_input(),
    output:
        png=report(
            PROFILE_FIGURE_FILES["profile_ncu_throughput"]["png"],
            caption="../report/profile_ncu_throughput.rst",
            category="Profiling",
            subcategory="Figures",
        ),
        pdf=PROFILE_FIGURE_FILES["profile_ncu_throughput"]["pdf"],
    log:
        f"{PROFILE_LOGS}/figure_ncu_throughput.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        source=NCU_FIGURE_SOURCE,
    shell:
        "python -m scalestudy.profiling.figures ncu-throughput {params.source:q}"
        " --png {output.png:q} --pdf {output.pdf:q} > {log:q} 2>&1"


# Every final output of the stage (rule all includes it).
provide(
    "profile",
    [
        *rules.profile_combine.output,
        *(path for files in PROFILE_FIGURE_FILES.values() for path in files.values()),
        *NCU_TARGETS.values(),
    ],
)
