"""torchrun (torch.distributed.run) for the local launcher, exiting as its ranks do.

A run stopped by SIGTERM or SIGUSR1 (Snakemake stopping, Slurm's warning signal) saves a checkpoint
on every rank, and the ranks exit EXIT_RESUMABLE (75) so that the retry resumes. torchrun itself
turns the signal into an exception and exits 1, and a run whose ranks exited 75 into a failure
(exit 1): a stopped 2-rank run then looks like a broken one. Here both exit EXIT_RESUMABLE, as a
one-rank run does; every other outcome is torchrun's own.

The ranks do not leave at the same instant: as soon as the first has exited 75, torchrun sends its
closing SIGTERM to the others, which may die of it (-15) on their way out. That is still a stop, not
a crash: the checkpoint is collective, so a rank past it means every rank was; and a retry resumes
from the newest complete checkpoint whatever happened after it.

    python -m scalestudy.launch.torchrun [torchrun's arguments]
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

from scalestudy.contract import EXIT_RESUMABLE, STOP_SIGNALS

CLOSED_BY_TORCHRUN = -signal.SIGTERM  # the exit code of a rank ended by the agent's closing signal


def resumable(error: BaseException) -> bool:
    """The agent was stopped by a stop signal, or a rank exited EXIT_RESUMABLE and every other
    failed rank did too or died of torchrun's closing SIGTERM."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if isinstance(error, SignalException):
        return error.sigval in STOP_SIGNALS
    if isinstance(error, ChildFailedError):
        codes = {failure.exitcode for failure in error.failures.values()}
        return EXIT_RESUMABLE in codes and codes <= {EXIT_RESUMABLE, CLOSED_BY_TORCHRUN}
    return False


def main(argv: Sequence[str] | None = None) -> int:
    from torch.distributed import run

    try:
        run.main(list(sys.argv[1:] if argv is None else argv))
    except Exception as error:
        if not resumable(error):
            raise
        stopped = error.__class__.__name__
        print(f"torchrun: stopped ({stopped}): exit {EXIT_RESUMABLE}, resumable", file=sys.stderr)
        return EXIT_RESUMABLE
    return 0


if __name__ == "__main__":
    sys.exit(main())
