# scaling: the strong and weak grid; one job per (mode, world size, repeat).


use rule baseline_run as scaling_run with:
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
