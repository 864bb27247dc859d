# container: the Apptainer image the study runs in (docs/slurm.md, "The image").
#
# The image is used when Snakemake runs with --software-deployment-method apptainer (profiles/slurm):
# - CPU rules name it in `container:` (cluster.container_image); Snakemake wraps their shell in
#   `apptainer exec`. A local .sif need not exist when the DAG is built, only when a job runs, and
#   Snakemake does not know that this rule makes it: jobs list image_input() as an input, so the
#   build comes first.
# - training rules have no `container:` (Snakemake would wrap srun itself); scalestudy.launch puts
#   `apptainer exec` around every rank, on every node: launch_spec(..., containerized=CONTAINERIZED).
# container.prebuilt names an existing image instead; then nothing is built.

from snakemake.settings.types import DeploymentMethod

from scalestudy import launch as _launch

CONTAINERIZED = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
IMAGE = cluster.container_image(config)
IMAGE_BUILD = cluster.image_build_target(config)
CONTAINER = cluster.container_settings(config)


def image_input():
    """The image as an input of every containerized job, when this workflow builds it."""
    return [IMAGE_BUILD] if CONTAINERIZED and IMAGE_BUILD else []


# Provenance of the CPU rules (scalestudy.provenance reads these): the image and its sha256,
# hashed once and cached beside the image. APPTAINERENV_* survive apptainer's --cleanenv.
if CONTAINERIZED and os.path.isfile(IMAGE):
    for _name, _value in {
        _launch.IMAGE_ENV: os.path.abspath(IMAGE),
        _launch.IMAGE_SHA256_ENV: _launch.image_sha256(IMAGE),
    }.items():
        os.environ[_name] = os.environ[f"APPTAINERENV_{_name}"] = _value


if IMAGE_BUILD:

    rule build_image:
        input:
            definition=CONTAINER["definition"],
            requirements="envs/requirements.txt",
        output:
            IMAGE_BUILD,
        params:
            args=CONTAINER["build_args"],
        log:
            "results/logs/build_image.log",
        localrule: on_submit_host("build_image")
        resources:
            **light_resources(),
        shell:
            "apptainer build --force {params.args:q} {output:q} {input.definition:q} > {log:q} 2>&1"
