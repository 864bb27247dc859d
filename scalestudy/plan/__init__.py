"""Planning the study: the config's schema and checks, the grid and each point's run config, the
cluster's resources, and where every file goes (results/ folders, the run folder's files).
Standard library only at module level: the Snakefile imports this subpackage when it parses the
workflow, so it must stay fast to import (tests/test_import_graph.py checks it)."""
