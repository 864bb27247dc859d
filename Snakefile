# scalestudy: a reproducible scaling study of PyTorch DDP training on a Slurm GPU cluster.
#   demo (default config):  snakemake --profile profiles/local
#   the real study:         snakemake --profile profiles/slurm --configfile config/config.yaml
#   report:                 snakemake --report results/report.html [same options]

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from scalestudy import provenance
from scalestudy.plan import configcheck, schema

min_version("9.0")


# The embedded default is the offline demo; a --configfile replaces it rather than being merged
# into it, so no demo value can leak into a real study.
if not workflow.overwrite_configfiles:

    configfile: "config/demo.yaml"


# The schema ships with the package (scalestudy/plan/schema.yaml; config/schema.yaml links to it).
try:
    validate(config, schema.PATH)
except WorkflowError as error:  # one line naming the key, not the whole schema
    message = configcheck.schema_error_message(error, workflow.overwrite_configfiles)
    if message is None:
        raise
    raise WorkflowError(message) from None
configcheck.check(config)  # what JSON Schema lets through (2.0 as an integer, ...)
provenance.export_git_state(workflow.basedir)


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/container.smk"
include: "rules/fetch.smk"
include: "rules/preprocess.smk"
# Checks before any training job (their results: TRAINING_GATES, common.smk).
include: "rules/sitecheck.smk"
include: "rules/system.smk"
include: "rules/smoke.smk"
include: "rules/comm.smk"
include: "rules/gate.smk"
include: "rules/baseline.smk"
include: "rules/scaling.smk"
include: "rules/profile.smk"
include: "rules/sensitivity.smk"
include: "rules/aggregate.smk"
include: "rules/plots.smk"
include: "rules/compare.smk"
include: "rules/paper.smk"
include: "rules/track.smk"
include: "rules/crate.smk"


rule all:
    input:
        PROFILE_TARGETS,
        ANALYSIS_TARGETS,
        FIGURE_TARGETS,
        PAPER_TARGETS,
        TRACK_TARGETS,
        COMPARE_TARGETS,
        CRATE_TARGETS,
    default_target: True


# The rules that run on the submit host (Snakemake's localrules), from one list (rules/common.smk),
# once every rule exists; the `localrules:` keyword itself takes only literal names.
workflow.localrules(*submit_host_rules())


onstart:
    for hook in ONSTART_HOOKS:  # rules/common.smk
        hook()


onsuccess:
    for hook in ONEXIT_HOOKS:  # rules/common.smk
        hook()


onerror:
    for hook in ONEXIT_HOOKS:
        hook()
