# scaling: the strong and weak grid; one job per (mode, world size, repeat).


use rule baseline_run as scaling_run with:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        gate=after_training_gate,
        compiled=compile_input("scaling"),
    output:
        **run_outputs("scaling"),
    log:
        run_log("scaling"),
    benchmark:
        run_benchmark("scaling")
    threads: train_threads("scaling")
    resources:
        **train_resources("scaling"),
    params:
        **run_params("scaling"),
