# container: builds the Apptainer image the study runs in (docs/guide/cluster.md, "The image").
#
# The image is used when Snakemake runs with --software-deployment-method apptainer (profiles/slurm):
# - CPU rules name it in `container:` (cluster.container_image); Snakemake wraps their shell in
#   `apptainer exec`. A local .sif need not exist when the DAG is built, only when a job runs, and
#   Snakemake does not know that this rule makes it: jobs list image_input() as an input, so the
#   build comes first.
# - training rules have no `container:` (Snakemake would wrap srun itself); scalestudy.launch.launcher puts
#   `apptainer exec` around every rank, on every node: launch_spec(..., containerized=CONTAINERIZED).
# container.prebuilt names an existing image instead; then nothing is built.
# - rule image_digest hashes the image once (after build_image, or once for a prebuilt image) into
#   results/image/<image name>.sha256.json; every containerized job lists it (image_input()), and
#   the launcher and provenance read the sha256 from it (scalestudy/launch/container_image.py).
# (The image's settings and image_input() are in rules/common/values.smk.)
# User strings reach params only through params functions: Snakemake does not format a function's
# value, so a `{` in a setting is never taken for a wildcard.

if IMAGE_BUILD:

    rule build_image:
        input:
            definition=CONTAINER["definition"],
            requirements="envs/requirements.txt",
        output:
            IMAGE_BUILD,
        log:
            f"{paths.LOGS_DIR}/build_image.log",
        # apptainer build runs on the host; this env supplies apptainer where the host has none.
        conda:
            APPTAINER_ENV
        resources:
            **light_resources(),
        params:
            args=lambda wildcards: CONTAINER["build_args"],
        shell:
            "apptainer build --force {params.args:q} {output:q} {input.definition:q} > {log:q} 2>&1"


if CONTAINERIZED:

    rule image_digest:
        input:
            IMAGE,
        output:
            IMAGE_DIGEST,
        log:
            f"{paths.LOGS_DIR}/image_digest.log",
        # One read of the image where Snakemake runs (cluster.ALWAYS_ON_SUBMIT_HOST).
        conda:
            SOFTWARE_ENV
        shell:
            "python -m scalestudy.launch.container_image --image {input:q} --out {output:q} > {log:q} 2>&1"
