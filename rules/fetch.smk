# fetch: the workload's raw data from mirrors then its URL, or generated offline (source synthetic):
# the CIFAR-10 archive, or the LM's text corpus. A command workload brings its own data: no fetch.


if ARCHIVE:

    rule fetch:
        input:
            image=image_input(),
        output:
            archive=ensure(ARCHIVE, non_empty=True),
        log:
            f"{paths.LOGS_DIR}/fetch.log",
        conda:
            SOFTWARE_ENV
        container:
            container_image()
        resources:
            **light_resources(),
        params:
            source=fetch_source(),
            args=fetch_args,
        shell:
            "python -m scalestudy.data.fetch --source {params.source:q} --out {output.archive:q}"
            " {params.args:q} > {log:q} 2>&1"
