"""The contract's old import path (`from scalestudy import contract`), kept for scripts written
against it: the contract lives in scalestudy.workloads.command.contract."""

from scalestudy.workloads.command.contract import (  # noqa: F401
    CHECKPOINT_DIR_ENV,
    EXIT_RESUMABLE,
    OUT_DIR_ENV,
    PROGRESS_ENV,
    RUN_CONFIG_ENV,
    STOP_SIGNALS,
    Reporter,
)
