"""The string patterns of config values that reach a shell or a file name unquoted, and what they mean.

schema.yaml carries the same patterns (tests/test_cluster.py checks it); configcheck and cluster
check values against them and name the key and the meaning in their errors. Standard library only.
"""

# A local path or command name: nothing a shell expands or splits, no wildcard braces, no leading
# "-" (an option) and no ":" (an image URL such as docker://). The image path goes unquoted into
# Snakemake's apptainer command (container.sif, container.prebuilt).
SAFE_PATH = r"^[A-Za-z0-9_.+@%,=/][A-Za-z0-9_.+@%,=/-]*$"
# A Slurm partition, account, QOS or GRES type.
SLURM_NAME = r"^[A-Za-z0-9_.+-]+$"
# A Slurm feature expression (sbatch -C 'a100&ib'); the executor plugin quotes it.
SLURM_CONSTRAINT = r"^[A-Za-z0-9_.&|!*\[\]():,-]+$"
# An environment value of the ranks (nccl:). It passes through apptainer's environment setup, which
# runs in a shell interpreter, so it carries no shell syntax (a conservative choice, not checked
# against a real Apptainer here). Covers NCCL's list and exclusion syntax: '^docker0,lo',
# '=mlx5_0:1,mlx5_1:1', '/tmp/nccl.%h.%p.log'.
ENV_VALUE = r"^[A-Za-z0-9_.,:=^/%@+-]*$"
# A rule name or a glob pattern of rule names (cluster.submit_host_rules).
RULE_GLOB = r"^[A-Za-z0-9_*?!\[\]-]+$"
# The name of an environment variable (data.credentials_env: the variable, never its value).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# A unit of throughput (workload.command.sample_unit): it appears in figures, tables and LaTeX.
UNIT_NAME = r"^[A-Za-z][A-Za-z0-9-]*$"

MEANINGS = {
    SAFE_PATH: "a local path of letters, digits and _ . + @ % , = / - (no whitespace, quotes, braces, "
    "':' or other shell syntax; not starting with -)",
    SLURM_NAME: "a Slurm name of letters, digits and _ . + -",
    SLURM_CONSTRAINT: "a Slurm feature expression of letters, digits and _ . & | ! * [ ] ( ) : , -",
    ENV_VALUE: "an environment value of letters, digits and _ . , : = ^ / % @ + - (no whitespace, "
    "quotes or shell syntax)",
    RULE_GLOB: "a rule name or glob pattern of letters, digits and _ * ? ! [ ] -",
    ENV_NAME: "the name of an environment variable: a letter or _, then letters, digits and _ (the"
    " variable holds the login, the config only its name)",
    UNIT_NAME: "a unit name: a letter, then letters, digits and - (samples, tokens, images)",
}
