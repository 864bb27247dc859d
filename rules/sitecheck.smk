# sitecheck: fail fast on a wrong site. Before any training job, one cheap job on the GPU partition
# starts two ranks exactly as a training job does (srun, the image around each rank, the nccl:
# environment) and checks the host driver against the image's CUDA, that torch sees the job's GPUs,
# the network interfaces named in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, and that the process
# group initialises (scalestudy/preflight/site.py; docs/guide/cluster.md, "Site check"). A failure stops the
# workflow with one paragraph saying what to change; every training rule waits for the result.

import re

# SITE_CHECK, SITE_NAME, SITE_RESULT, SITE_CHECKED (what the other checks wait for): rules/common/paths.smk.
# Two ranks, as the study's multi-rank points start them (one, if the study has none).
SITE_WORLD = min(2, grid.largest_world_size(config))


rule site_check:
    input:
        image=image_input(),
    output:
        SITE_RESULT,
    log:
        f"{paths.LOGS_DIR}/site/{{site}}.log",
    wildcard_constraints:
        site=re.escape(SITE_NAME),
    # One job of the preflight group on Slurm (scalestudy/plan/groups.py).
    group:
        short_job_group("site_check")
    # No container: here: scalestudy.launch.launcher puts the image around each rank, as for training.
    conda:
        SOFTWARE_ENV
    threads: rank_threads(lambda wc: SITE_WORLD)
    # A training job's resources for SITE_WORLD ranks, with the check's short wall time (in the
    # group: the group's shape, with that wall time).
    resources:
        **grouped_resources(
            "site_check",
            {
                key: (lambda wc, attempt, key=key: sitecheck.job_resources(config, SITE_WORLD, attempt)[key])
                for key in cluster.TRAIN_RESOURCE_KEYS
            },
        ),
        gpu=gpu_resource(lambda wc: SITE_WORLD),
    params:
        launch=launch_json(lambda wc: SITE_WORLD),
        # params functions: values from the config are never formatted as wildcards
        backend=lambda wc: config["train"]["backend"],
        device=lambda wc: config["train"]["device"],
        timeout=lambda wc: SITE_CHECK["timeout_s"],
    shell:
        "python -m scalestudy.preflight.site run --launch-json {params.launch:q} --site {wildcards.site:q}"
        " --backend {params.backend:q} --device {params.device:q} --timeout-s {params.timeout:q}"
        " --out {output:q} > {log:q} 2>&1"
