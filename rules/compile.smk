# compile: one job per compile key that several grid points share (scalestudy/plan/compilejobs.py,
# issue 51): a short training run that compiles the key's step and saves the artifacts
# (torch.compiler.save_cache_artifacts) that each of those points loads into its own cache folder
# before it compiles. A study without model.compile plans none. The training rules wait for their
# key's artifacts through compile_input (rules/common/paths.smk, with COMPILE_JOBS and compile_world).

COMPILE_FILES = {
    "artifacts": f"{paths.COMPILE_DIR}/{{key}}/{compilejobs.compilekeys.ARTIFACTS}",
    "record": f"{paths.COMPILE_DIR}/{{key}}/compile.json",
}


if COMPILE_JOBS:

    rule compile_cache:
        input:
            TRAIN_INPUTS,
            manifest=PACKED_MANIFEST,
            image=image_input(),
            gate=after_training_gate,
        output:
            **COMPILE_FILES,
        log:
            f"{paths.LOGS_DIR}/compile/{{key}}.log",
        benchmark:
            f"{paths.BENCHMARKS_DIR}/compile/{{key}}.tsv"
        wildcard_constraints:
            key="|".join(COMPILE_JOBS),
        conda:
            SOFTWARE_ENV
        threads: rank_threads(compile_world)
        resources:
            **world_resources(compile_world),
            attempt=lambda wc, attempt: attempt,
            gpu=gpu_resource(compile_world),
        params:
            run=lambda wc: json.dumps(compilejobs.run_config(config, COMPILE_JOBS[wc.key]), sort_keys=True),
            launch=launch_json(compile_world),
            out_dir=lambda wc: f"{COMPILE_JOBS[wc.key].folder}/run",
        shell:
            "python -m scalestudy.launch --launch-json {params.launch:q}"
            " --log {log:q} --attempt {resources.attempt} --"
            " --run-config-json {params.run:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
