# baseline: the one-GPU reference run (classic DataLoader, fp32) the optimisations are judged by.
# The scaling and sensitivity stages reuse this rule's inputs and command (use rule), each with its
# own compiled input (the artifacts of its points' compile keys, rules/compile.smk).


rule baseline_run:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        gate=after_training_gate,
        compiled=compile_input("baseline"),
    output:
        **run_outputs("baseline"),
    log:
        run_log("baseline"),
    benchmark:
        run_benchmark("baseline")
    # No container: here: scalestudy.launch.launcher puts the image around each rank (see docs/guide/cluster.md).
    conda:
        SOFTWARE_ENV
    threads: train_threads("baseline")
    resources:
        **train_resources("baseline"),
    params:
        **run_params("baseline"),
    shell:
        "python -m scalestudy.launch --launch-json {params.launch:q}"
        " --log {log:q} --attempt {resources.attempt} --"
        " --run-config-json {params.run:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"
