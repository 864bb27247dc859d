#!/bin/sh
# Put on PATH before the Slurm clients as sbatch, squeue, sacct and scontrol (symlinks): logs each
# call ("<epoch seconds> <command> <arguments>") to $SLURM_CALL_LOG, then runs the real one.
name=$(basename "$0")
echo "$(date +%s.%N) $name $*" >>"${SLURM_CALL_LOG:?}"
PATH=$(printf %s "$PATH" | tr : '\n' | grep -vxF "$(dirname "$0")" | paste -sd:)
exec "$name" "$@"
