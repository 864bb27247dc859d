"""Where the workflow writes: the folders under results/ that its rules write, named once.

The rules (rules/*.smk, rules/common/paths.smk) build their outputs from these names; the modules
that find a file the workflow wrote (the paper, the analysis, the pre-flight checks) import them too.
(Some command lines still spell their own default folder: smoke.py, system.py, tracking/.) The files inside
a run folder are named in scalestudy.plan.runfiles. Standard library only (the Snakefile imports it).
"""

RESULTS_DIR = "results"
LOGS_DIR = f"{RESULTS_DIR}/logs"  # every rule's log, in a folder named like its outputs' folder
BENCHMARKS_DIR = f"{RESULTS_DIR}/benchmarks"  # Snakemake's benchmark: files
RAW_DATA_DIR = f"{RESULTS_DIR}/data"  # the fetched archive or corpus
PACKED_DIR = f"{RESULTS_DIR}/data/packed"  # preprocess's arrays and PACKED_MANIFEST
PACKED_MANIFEST = "manifest.json"  # in PACKED_DIR, written last: what the arrays are (preprocess, tokenize)
IMAGE_DIR = f"{RESULTS_DIR}/image"  # the container image's sha256 (scalestudy.launch.container_image)
RUNS_DIR = f"{RESULTS_DIR}/runs"  # one run folder per grid point: <stage>/<point>
CHECKPOINTS_DIR = f"{RESULTS_DIR}/checkpoints"  # <stage>/<point>, emptied when a run finishes
INDUCTOR_CACHE_DIR = f"{RESULTS_DIR}/inductor-cache"  # torch.compile's caches, one folder per run
COMPILE_DIR = f"{RESULTS_DIR}/compile"  # one compile job's artifacts per compile key (plan.compilekeys)
GATES_DIR = f"{RESULTS_DIR}/gates"  # the training gate's record
SITE_DIR = f"{RESULTS_DIR}/site"  # the site check's result per site
SYSTEM_DIR = f"{RESULTS_DIR}/system"  # the system description
SMOKE_DIR = f"{RESULTS_DIR}/smoke"  # the smoke tests' results
COMM_DIR = f"{RESULTS_DIR}/comm"  # the collective benchmark
PROFILE_DIR = f"{RESULTS_DIR}/profile"  # the profile stage's traces and tables
TABLES_DIR = f"{RESULTS_DIR}/tables"
FIGURES_DIR = f"{RESULTS_DIR}/figures"
PAPER_DIR = f"{RESULTS_DIR}/paper"
PAPER_FIGURES_DIR = f"{PAPER_DIR}/figures"
CRATE_DIR = f"{RESULTS_DIR}/crate"  # the study as a Workflow Run RO-Crate (and crate.zip beside it)
COMPARE_DIR = f"{RESULTS_DIR}/compare"  # the comparison with another study (compare.against)
COMPARISON_TABLE = f"{TABLES_DIR}/comparison.csv"  # rule compare writes it, the paper reads it
# how the study ran, in the report's words (scalestudy.analysis.execution): report/*.rst include it
REPORT_TEXT = f"{RESULTS_DIR}/report/executed.rst"
