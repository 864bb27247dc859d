"""The trainer: `python -m scalestudy.train --run-config-json JSON | --run-config PATH --out-dir DIR`.

The program every rank runs, whatever the workload: reads and checks the run config (once:
scalestudy.plan.runconfig) and the launcher's environment; a command workload's run goes to its
runner (scalestudy.workloads.command.runner), any other to a Trainer (scalestudy.train.trainer): device
and backend, then setup, resume, fit and finish in the run's process settings
(scalestudy.train.process). Exit codes (scalestudy.contract): 0 done, EXIT_BAD_CONFIG (2) bad input,
EXIT_RESUMABLE (75) stopped by a signal after a checkpoint."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from scalestudy.contract import EXIT_BAD_CONFIG
from scalestudy.data.preprocess import PackedDataError
from scalestudy.launch import distributed
from scalestudy.plan import runconfig, workloads
from scalestudy.plan.runconfig import RunConfigError, check_locations, load_run_config
from scalestudy.plan.workload_spec import resolve
from scalestudy.progress import setup_logging
from scalestudy.train import journal, startup
from scalestudy.train.datafit import check_batch_fits
from scalestudy.train.process import exit_now, keep_freed_host_memory, process_settings
from scalestudy.train.state import StopRequest
from scalestudy.train.trainer import Trainer

log = logging.getLogger("scalestudy.train")


# --- run config -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.train", description=__doc__.splitlines()[0])
    runconfig.add_arguments(parser)
    return parser.parse_args(argv)


# --- entry point --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, exit_process: bool = False) -> int:
    """The trainer's command line; `exit_process` (python -m) ends the process here (see exit_now).
    Every rule, the profiler and the smoke test start any workload the same way."""
    startup.begin()
    args = parse_args(argv)
    setup_logging(getattr(logging, args.log_level.upper(), logging.INFO))
    try:
        given, config = load_run_config(args)
        dist_env = distributed.from_environ()
        distributed.die_with_launcher()  # a torchrun rank ends with its agent, even a SIGKILLed one
        if dist_env.world_size != config["world_size"]:
            raise RunConfigError(
                f"run config world_size={config['world_size']} but the {dist_env.launcher} environment "
                f"has {dist_env.world_size} ranks"
            )
        entry = workloads.get(config["workload"]).entry  # a workload that runs its ranks itself
        if entry is not None:
            return resolve(entry)(config, given, args.out_dir, dist_env)
        device = distributed.select_device(config["device"], dist_env.local_rank)
        backend = distributed.select_backend(config["backend"], device)
        check_locations(config, args.out_dir)
        check_batch_fits(config)  # before any process group: a batch larger than the data is bad input
        startup.mark("config")
    except (RunConfigError, ValueError) as error:
        log.error("%s", error)
        return EXIT_BAD_CONFIG
    if not dist_env.is_main:
        logging.getLogger("scalestudy").setLevel(logging.WARNING)
    trainer = Trainer(config, given, args.out_dir, dist_env, device, backend)
    code = run(trainer, config)
    if exit_process:
        exit_now(code)  # while `trainer` (model, DDP reducer, profiler) is still alive
    return code


def run(trainer: Trainer, config: dict[str, Any]) -> int:
    with process_settings(config), StopRequest() as stop:
        try:
            with journal.follow(trainer):  # rank 0's MLflow run, where tracking is on
                trainer.setup()
                trainer.checkpointer.resume()
                code = trainer.fit(stop)
                if code == 0:
                    trainer.finish()
                elif trainer.monitor:
                    trainer.monitor.stop()
                trainer.live.ended(code)
            return code
        except (RunConfigError, PackedDataError) as error:
            log.error("%s", error)
            return EXIT_BAD_CONFIG
        finally:
            trainer.close()
            distributed.destroy_process_group()


def run_as_program() -> None:
    """`python -m scalestudy.train`: the trainer's process from start to exit."""
    keep_freed_host_memory()
    exit_now(main(exit_process=True))


if __name__ == "__main__":
    run_as_program()
