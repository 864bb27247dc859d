# system: the system under test. One job per node kind the study uses: `compute` (shaped like the
# grid's largest training job, so it spans every node a training job can; one task per node via
# srun, inside the image) and, when cluster.cpu_partition is set, `cpu` (where the light jobs run).
# Each node writes results/system/<hostname>.json; results/tables/system.csv has one row per host.

import json

SYSTEM_DIR = paths.SYSTEM_DIR
SYSTEM_LOGS = f"{paths.LOGS_DIR}/system"
SYSTEM_WORLD = grid.largest_world_size(config)
SYSTEM_KINDS = ["compute", *(["cpu"] if cluster.settings(config)["cpu_partition"] else [])]
SYSTEM_ARGS = ["--out-dir", SYSTEM_DIR, "--results-dir", paths.RESULTS_DIR, "--data-dir", paths.PACKED_DIR]


rule system:
    input:
        image=image_input(),
        site=SITE_CHECKED,
    output:
        index=f"{SYSTEM_DIR}/nodes_compute.json",
    log:
        f"{SYSTEM_LOGS}/compute.log",
    benchmark:
        f"{paths.BENCHMARKS_DIR}/system/compute.tsv"
    group:
        short_job_group("system")  # the preflight group on Slurm (scalestudy/plan/groups.py)
    # No container: here: scalestudy.preflight.system puts the image around each per-node task.
    conda:
        SOFTWARE_ENV
    threads: 1
    resources:
        **grouped_resources("system", world_resources(lambda wc: SYSTEM_WORLD)),
    params:
        # a params function: values from the config are never formatted as wildcards
        launch=launch_json(lambda wc: SYSTEM_WORLD),
        args=SYSTEM_ARGS,
    shell:
        "python -m scalestudy.preflight.system describe {params.args:q} --kind compute"
        " --launch-json {params.launch:q} --index {output.index:q} > {log:q} 2>&1"


rule system_cpu:
    input:
        image=image_input(),
    output:
        index=f"{SYSTEM_DIR}/nodes_cpu.json",
    log:
        f"{SYSTEM_LOGS}/cpu.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    params:
        args=SYSTEM_ARGS,
    shell:
        "python -m scalestudy.preflight.system describe {params.args:q} --kind cpu --index {output.index:q}"
        " > {log:q} 2>&1"


rule table_system:
    input:
        index=expand(f"{SYSTEM_DIR}/nodes_{{kind}}.json", kind=SYSTEM_KINDS),
        image=image_input(),
    output:
        table_report("system.csv", "System", "System under test"),
    log:
        f"{SYSTEM_LOGS}/table.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.preflight.system table --index {input.index:q} --out {output:q} > {log:q} 2>&1"


provide("analysis", [rules.table_system.output[0]])
