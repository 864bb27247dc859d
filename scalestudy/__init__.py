"""scalestudy: a reproducible scaling study of PyTorch DDP training on Slurm GPU clusters.

All of the workflow's logic lives in this package; the Snakemake rules only orchestrate.
The modules the workflow's controller process imports (plan/: schema, grid, cluster, run configs;
launch/launcher, provenance) import no third-party package at module level: parsing the Snakefile
has to stay fast (tests/test_import_graph.py). docs/reference/modules.md lists every module.
"""

__version__ = "0.1.0"
