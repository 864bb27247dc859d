# preprocess: the fetched data -> packed arrays a trainer memory-maps, and a manifest: CIFAR-10's six
# batch files -> uint8 images and labels; a text corpus -> byte tokens (uint16, scalestudy.data.tokenize).


if WORKLOAD.data is workloads.CIFAR10:

    rule preprocess:
        input:
            archive=ARCHIVE,
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
            out_dir=lambda wildcards, output: os.path.dirname(output.manifest[0]),
        shell:
            "python -m scalestudy.data.preprocess --archive {input.archive:q} --out-dir {params.out_dir:q}"
            " > {log:q} 2>&1"

elif WORKLOAD.data is workloads.TEXT:

    rule preprocess:
        input:
            corpus=ARCHIVE,
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
            out_dir=lambda wildcards, output: os.path.dirname(output.manifest[0]),
            test_fraction=config["data"]["test_fraction"],
            seq_len=grid.gpt_seq_len(config),
        shell:
            "python -m scalestudy.data.tokenize --corpus {input.corpus:q} --out-dir {params.out_dir:q}"
            " --test-fraction {params.test_fraction:q} --seq-len {params.seq_len:q} > {log:q} 2>&1"
