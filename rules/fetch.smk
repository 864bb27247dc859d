# fetch: the CIFAR-10 archive, from mirrors then the official URL (or generated, source synthetic).

ARCHIVE = "results/data/cifar-10-python.tar.gz"


rule fetch:
    input:
        image=image_input(),
    output:
        archive=ensure(ARCHIVE, non_empty=True),
    params:
        source=config["data"]["source"],
        args=fetch_args,
    log:
        "results/logs/fetch.log",
    localrule: on_submit_host("fetch")
    resources:
        **light_resources(),
    conda: SOFTWARE_ENV
    container: container_image()
    shell:
        "python -m scalestudy.data.fetch --source {params.source:q} --out {output.archive:q}"
        " {params.args:q} > {log:q} 2>&1"
