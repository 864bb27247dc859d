# comm: the collective benchmark (scalestudy/preflight/collectives.py). Per world size > 1 of the scaling grid,
# one job shaped like that size's training jobs (same nodes, ranks per node, image, nccl: settings)
# times all-reduce, all-gather and reduce-scatter on the study's backend as nccl-tests does; then
# the rows are combined (results/comm/busbw.csv) and alpha and beta fitted per world size and
# placement (results/tables/comm_bench_fit.csv), which the communication model uses.

COMM_DIR = paths.COMM_DIR
COMM_LOGS = f"{paths.LOGS_DIR}/comm"
COMM_WORLDS = sorted(world for world in config["scaling"]["world_sizes"] if world > 1)
COMM_SETTINGS = {
    **config["comm_bench"],
    "device": config["train"]["device"],
    "backend": config["train"]["backend"],
    "timeout_s": config["train"]["pg_timeout_s"],
}


rule comm_bench:
    input:
        image=image_input(),
        site=SITE_CHECKED,
    output:
        f"{COMM_DIR}/w{{world}}.csv",
    log:
        f"{COMM_LOGS}/w{{world}}.log",
    benchmark:
        f"{paths.BENCHMARKS_DIR}/comm/w{{world}}.tsv"
    wildcard_constraints:
        world="|".join(map(str, COMM_WORLDS)) or "none",
    group:
        short_job_group("comm_bench")  # the preflight group on Slurm (scalestudy/plan/groups.py)
    # No container: here: scalestudy.launch.launcher puts the image around each rank.
    conda:
        SOFTWARE_ENV
    threads: rank_threads(lambda wc: int(wc.world))
    resources:
        **grouped_resources("comm_bench", world_resources(lambda wc: int(wc.world))),
        gpu=gpu_resource(lambda wc: int(wc.world)),
    params:
        launch=launch_json(lambda wc: int(wc.world)),
        settings=lambda wc: json.dumps(COMM_SETTINGS, sort_keys=True),  # a function: never formatted
    shell:
        "python -m scalestudy.launch --launch-json {params.launch:q} --module scalestudy.preflight.collectives --"
        " run --settings-json {params.settings:q} --out {output:q} > {log:q} 2>&1"


rule table_comm_bench:
    input:
        bench=expand(rules.comm_bench.output[0], world=COMM_WORLDS),
        image=image_input(),
    output:
        busbw=f"{COMM_DIR}/busbw.csv",
        fit=table_report("comm_bench_fit.csv", "Model", "Communication benchmark"),
    log:
        f"{COMM_LOGS}/fit.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.preflight.collectives fit --bench {input.bench:q} --busbw-out {output.busbw:q}"
        " --fit-out {output.fit:q} > {log:q} 2>&1"


provide("comm_results", rules.table_comm_bench.input.bench)  # rule track sends them to MLflow
provide("analysis", rules.table_comm_bench.output)
