# scalestudy: a reproducible scaling study of PyTorch DDP training on a Slurm GPU cluster.
#   demo (default config):  snakemake --profile profiles/local
#   the real study:         snakemake --profile profiles/slurm --configfile config/config.yaml
#   report:                 snakemake --report results/report.html [same options]

import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

from scalestudy import provenance
from scalestudy.plan import configcheck, credentials, schema

min_version("9.0")


# The embedded default is the offline demo; a --configfile replaces it rather than being merged
# into it, so no demo value can leak into a real study.
if not workflow.overwrite_configfiles:

    configfile: "config/demo.yaml"


# A credential in the config (a URL's user:password@, a token= query) is refused before anything
# else: the schema's messages quote the value they refuse, and the crate, Snakemake's metadata and
# the jobs' command lines record every value (scalestudy/plan/credentials.py). One line, exit 2.
if refused := credentials.refusal(config, workflow.configfiles):
    print(refused, file=sys.stderr)
    sys.exit(2)


# The schema ships with the package (scalestudy/plan/schema.yaml; config/schema.yaml links to it),
# handed to validate() as JSON (see schema.as_json_file).
try:
    with schema.as_json_file() as schema_file:
        validate(config, schema_file)
except WorkflowError as error:  # one line naming the key, not the whole schema
    message = configcheck.schema_error_message(error, workflow.overwrite_configfiles)
    if message is None:
        raise
    raise WorkflowError(message) from None
configcheck.check(config)  # what JSON Schema lets through (2.0 as an integer, ...)
provenance.export_git_state(workflow.basedir)


report: "report/workflow.rst"


# The include order matters in two ways, both checked by tests/test_include_order.py:
# - the shared helpers first (rules/common/), each file using only those above it when it is read, by
#   role: values (what the study trains, params), paths, resources, report, hooks (registries,
#   start/exit hooks);
# - a rule file that names another file's rule (rules.X, read when the file is) after that file:
#   aggregate.smk after comm.smk and profile.smk; plots.smk after aggregate.smk and comm.smk; paper.smk
#   after system.smk, comm.smk, profile.smk and aggregate.smk; compare.smk after aggregate.smk;
#   crate.smk after gate.smk. What a rule file registers (provide, gate_training_on, on_start) is read
#   only once every file is included: its order does not matter.
include: "rules/common/values.smk"
include: "rules/common/paths.smk"
include: "rules/common/resources.smk"
include: "rules/common/report.smk"
include: "rules/common/hooks.smk"
include: "rules/container.smk"
include: "rules/fetch.smk"
include: "rules/preprocess.smk"
# Checks before any training job (gate_training_on, rules/common/hooks.smk).
include: "rules/sitecheck.smk"
include: "rules/system.smk"
include: "rules/smoke.smk"
include: "rules/comm.smk"
include: "rules/gate.smk"
include: "rules/compile.smk"
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


# Once every rule exists: the environment the jobs inherit, the GPUs the local executor schedules
# (rules/common/hooks.smk, prepare_workflow), and the rules that run on the submit host (Snakemake's
# localrules, from one list; the `localrules:` keyword itself takes only literal names).
prepare_workflow()
workflow.localrules(*submit_host_rules())


rule all:
    default_target: True
    input:
        # what each rule file registered for the study (provide(), rules/common/hooks.smk)
        provided("profile", "analysis", "figures", "paper", "track", "compare", "crate"),


onstart:
    run_hooks("start")  # rules/common/hooks.smk: on_start()


onsuccess:
    run_hooks("exit")  # on_exit()


onerror:
    run_hooks("exit")
