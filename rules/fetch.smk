# fetch: the CIFAR-10 archive, from mirrors then the official URL (or generated, source synthetic).

ARCHIVE = "results/data/cifar-10-python.tar.gz"


def fetch_args(wildcards):
    """The fetch command's arguments; every value is quoted by Snakemake's :q in the shell."""
    data = config["data"]
    if data["source"] == "synthetic":
        synthetic = data["synthetic"]
        return [
            "--train-per-class", synthetic["train_per_class"],
            "--test-per-class", synthetic["test_per_class"],
            "--seed", synthetic["seed"],
        ]
    args = ["--url", data["url"], "--md5", data["md5"], "--size", data["size_bytes"]]
    args += ["--timeout", data["timeout_s"], "--retries", data["retries"]]
    if data["sha256"]:
        args += ["--sha256", data["sha256"]]
    for mirror in data["mirrors"]:
        args += ["--mirror", mirror]
    return [str(arg) for arg in args]


rule fetch:
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
