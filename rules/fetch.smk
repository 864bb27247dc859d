# fetch: the workload's raw data from mirrors then its URL, or generated offline (source synthetic),
# by its data kind's fetch module (the CIFAR-10 archive, the LM's text corpus: scalestudy.data.fetch).
# A command workload brings its own data: no fetch.


if ARCHIVE:
    FETCH_SHELL, FETCH_SOURCE, FETCH_ARGS = fetch_command()

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
            source=FETCH_SOURCE,
            # a function: Snakemake formats a plain string param, and a URL may hold braces
            args=lambda wildcards: FETCH_ARGS,
        shell:
            FETCH_SHELL
