"""Planning the study: the config's checks, the grid and each point's run config, the cluster's
resources and the run folder's file names. Standard library only: the Snakefile imports this
subpackage when it parses the workflow, so it must stay fast to import."""
