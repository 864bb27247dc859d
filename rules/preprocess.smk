# preprocess: the fetched data -> packed arrays a trainer memory-maps, and a manifest, by the
# workload's data kind's preprocess module: CIFAR-10's six batch files -> uint8 images and labels
# (scalestudy.data.preprocess); a text corpus -> byte tokens (uint16, scalestudy.data.tokenize).


if WORKLOAD.data.preprocess:
    PREPROCESS_SHELL, PREPROCESS_OPTIONS = preprocess_command()

    rule preprocess:
        input:
            **{WORKLOAD.data.raw_option: ARCHIVE},
            image=image_input(),
        output:
            arrays=PACKED,
            manifest=PACKED_MANIFEST,
        log:
            f"{paths.LOGS_DIR}/preprocess.log",
        group:
            short_job_group("preprocess")  # the preflight group on Slurm (scalestudy/plan/groups.py)
        conda:
            SOFTWARE_ENV
        container:
            container_image()
        resources:
            **grouped_resources("preprocess", light_resources()),
        params:
            **PREPROCESS_OPTIONS,
            out_dir=lambda wildcards, output: os.path.dirname(output.manifest[0]),
        shell:
            PREPROCESS_SHELL
