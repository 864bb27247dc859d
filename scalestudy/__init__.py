"""scalestudy: a reproducible scaling study of PyTorch DDP training on Slurm GPU clusters.

All of the workflow's logic lives in this package; the Snakemake rules only orchestrate.
Modules that the workflow's controller process imports (config, grid, cluster, launch) must not
import torch at module level: parsing the Snakefile has to stay fast.
"""

__version__ = "0.1.0"
