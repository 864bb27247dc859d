# smoke: minutes of checks before the study (scalestudy/preflight/smoke.py). The data loader alone and the
# checkpoint's size and bandwidth (smoke_io, a one-rank job), and a few training steps through
# scalestudy.launch.launcher at world size 1 and at the grid's largest (smoke_step, jobs shaped like those
# training jobs; NCCL_DEBUG=INFO on GPUs). Every training job waits for them (gate_training_on).

from scalestudy.preflight import smoke as _smoke

SMOKE_DIR = _smoke.SMOKE_DIR
SMOKE_LOGS = f"{paths.LOGS_DIR}/smoke"
SMOKE_WORLDS = sorted({1, max(config["scaling"]["world_sizes"])})


# A command workload's loader and checkpoints are its script's own: only its training steps are
# checked.
SMOKE_IO = WORKLOAD.entry is None  # a workload that runs its ranks itself (scalestudy.plan.workload_spec)


if SMOKE_IO:

    rule smoke_io:
        input:
            TRAIN_INPUTS,
            manifest=PACKED_MANIFEST,
            image=image_input(),
            site=SITE_CHECKED,
        output:
            result=f"{SMOKE_DIR}/io.json",
        log:
            f"{SMOKE_LOGS}/io.log",
        benchmark:
            f"{paths.BENCHMARKS_DIR}/smoke/io.tsv"
        priority: 1  # before the system description and the benchmark: training waits for the smoke tests
        group:
            short_job_group("smoke_io")  # the preflight group on Slurm (scalestudy/plan/groups.py)
        conda:
            SOFTWARE_ENV
        threads: rank_threads(lambda wc: 1)
        resources:
            **grouped_resources("smoke_io", world_resources(lambda wc: 1)),
            gpu=gpu_resource(lambda wc: 1),  # the loader and the checkpoint on the job's GPU
        params:
            # params functions: values from the config are never formatted as wildcards
            launch=launch_json(lambda wc: 1),
            run=lambda wc: json.dumps(_smoke.io_run_config(config), sort_keys=True),
            settings=lambda wc: json.dumps(
                {key: config["smoke"][key] for key in _smoke.IO_KEYS}, sort_keys=True
            ),
            epoch=lambda wc: json.dumps(_smoke.saves_per_epoch(config), sort_keys=True),
        shell:
            "python -m scalestudy.launch --launch-json {params.launch:q} --module scalestudy.preflight.smoke --"
            " io --run-config-json {params.run:q} --settings-json {params.settings:q}"
            " --epoch-json {params.epoch:q} --out {output.result:q} > {log:q} 2>&1"


rule smoke_step:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        site=SITE_CHECKED,
    output:
        result=f"{SMOKE_DIR}/train_w{{world}}.json",
    log:
        f"{SMOKE_LOGS}/train_w{{world}}.log",
    benchmark:
        f"{paths.BENCHMARKS_DIR}/smoke/train_w{{world}}.tsv"
    wildcard_constraints:
        world="|".join(map(str, SMOKE_WORLDS)),
    priority: 1
    group:
        short_job_group("smoke_step")
    # No container: here: scalestudy.launch.launcher puts the image around each rank.
    conda:
        SOFTWARE_ENV
    threads: rank_threads(lambda wc: int(wc.world))
    resources:
        **grouped_resources("smoke_step", world_resources(lambda wc: int(wc.world))),
        gpu=gpu_resource(lambda wc: int(wc.world)),
    params:
        launch=launch_json(lambda wc: int(wc.world)),
        run=lambda wc: json.dumps(_smoke.step_run_config(config, int(wc.world)), sort_keys=True),
        out_dir=lambda wc, output: output.result.removesuffix(".json"),
    shell:
        "python -m scalestudy.preflight.smoke step --launch-json {params.launch:q} --run-config-json {params.run:q}"
        " --out-dir {params.out_dir:q} --out {output.result:q} > {log:q} 2>&1"


SMOKE_OUTPUTS = [
    *([rules.smoke_io.output.result] if SMOKE_IO else []),
    *expand(rules.smoke_step.output.result, world=SMOKE_WORLDS),
]


rule table_smoke:
    input:
        results=SMOKE_OUTPUTS,
        image=image_input(),
    output:
        table=table_report("smoke.csv", "System", "Smoke tests"),
        # the training jobs' gate (rules/gate.smk): one name, whatever the grid's world sizes
        passed=f"{SMOKE_DIR}/all.passed",
    log:
        f"{SMOKE_LOGS}/table.log",
    conda:
        SOFTWARE_ENV
    container:
        container_image()
    resources:
        **light_resources(),
    shell:
        "python -m scalestudy.preflight.smoke table --inputs {input.results:q} --out {output.table:q} > {log:q} 2>&1"
        " && printf '%s\\n' {input.results:q} > {output.passed:q}"


provide("smoke_results", SMOKE_OUTPUTS)  # rule track sends them to MLflow
provide("loader_smoke", [rules.smoke_io.output.result] if SMOKE_IO else [])  # the loader criterion
provide("analysis", [rules.table_smoke.output.table])
# Training waits for every smoke test to have passed (rules/gate.smk).
gate_training_on(rules.table_smoke.output.passed)
