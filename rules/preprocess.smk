# preprocess: the six batch files -> packed uint8 arrays a trainer memory-maps, and a manifest.


rule preprocess:
    input:
        archive=ARCHIVE,
        image=image_input(),
    output:
        arrays=PACKED,
        manifest=PACKED_MANIFEST,
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output.manifest),
    log:
        "results/logs/preprocess.log",
    localrule: on_submit_host("preprocess")
    resources:
        **light_resources(),
    conda: SOFTWARE_ENV
    container: container_image()
    shell:
        "python -m scalestudy.data.preprocess --archive {input.archive:q} --out-dir {params.out_dir:q}"
        " > {log:q} 2>&1"
