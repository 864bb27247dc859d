# sensitivity: DDP bucket size x per-GPU batch x precision at one world size.


use rule baseline_run as sensitivity_run with:
    input:
        TRAIN_INPUTS,
        manifest=PACKED_MANIFEST,
        image=image_input(),
        gate=after_training_gate,
        compiled=compile_input("sensitivity"),
    output:
        **run_outputs("sensitivity"),
    log:
        run_log("sensitivity"),
    benchmark:
        run_benchmark("sensitivity")
    threads: train_threads("sensitivity")
    resources:
        **train_resources("sensitivity"),
    params:
        **run_params("sensitivity"),
