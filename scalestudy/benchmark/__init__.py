"""Speed benchmarks: the project's data pipeline and trainer against plain tutorial-style
counterparts, per-job fixed cost, and the dry-run time of a 1,000-point grid.

`python -m scalestudy.benchmark --help`; the numbers and targets are in docs/guide/benchmarks.md.
"""
