"""From runs to conclusions: the run catalog, metrics, acceptance, the communication model and the
resource estimate. Each module has a command-line entry point, ``python -m scalestudy.analysis.<mod>``.
"""
