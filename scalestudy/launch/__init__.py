"""Starting the ranks of a job: the launcher (one process, torchrun, or srun with the image around
each rank), the rendezvous and process group of a rank, every attempt's log, and the container
image's digest. The launcher is standard library only (the Snakefile imports it)."""
