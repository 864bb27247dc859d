"""A run's checkpointer: given what it saves (model, optimizer, schedule, grad scaler and the run
state, scalestudy.train.state.RunState), `save()` writes a checkpoint of all of it and `resume()`
loads the interrupted attempt's, which rank 0 claims and hands to every rank. The format is the
workload's: one atomic file (scalestudy.train.checkpoint.single_file) or a DCP folder that reshards
(scalestudy.train.checkpoint.dcp). Every checkpoint also holds the run config, its hash and every
rank's RNG state; `finish()` retires (or marks finished) the checkpoints of a run that wrote its
outputs."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from scalestudy.launch import distributed
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.train.checkpoint import policy
from scalestudy.train.checkpoint import single_file as checkpoint
from scalestudy.train.state import RunState

log = logging.getLogger("scalestudy.train")


@dataclass(frozen=True)
class CheckpointSettings:
    """What the checkpointer reads of a run: where, how long the run is, what to keep, and the run
    config itself (saved in every checkpoint, and what a checkpoint found is compared with)."""

    directory: str
    run_config: Mapping[str, Any]
    config_hash: str
    epochs: int
    seed: int
    loader: Any
    keep: bool

    @classmethod
    def from_config(cls, config: dict[str, Any], config_hash: str) -> CheckpointSettings:
        return cls(
            directory=config["checkpoint_dir"],
            run_config=config,
            config_hash=config_hash,
            epochs=config["epochs"],
            seed=config["seed"],
            loader=config["loader"],
            keep=config["keep_checkpoints"],
        )


class Checkpointer:
    """Saves and resumes the objects it is given; `sharded` picks the DCP format (every rank writes
    and loads its shards), else rank 0 writes one file."""

    def __init__(
        self,
        settings: CheckpointSettings,
        *,
        sharded: bool,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler,
        scaler: torch.amp.GradScaler,
        run_state: RunState,
        rank: int,
        world_size: int,
    ) -> None:
        self.settings, self.sharded = settings, sharded
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        self.run_state = run_state
        self.rank, self.world_size, self.is_main = rank, world_size, rank == 0
        self.directory = settings.directory

    def resume(self) -> bool:
        """Rank 0 claims the checkpoint of this run's interrupted attempt, if there is one (any
        other is removed: scalestudy.train.checkpoint.single_file.claim and .dcp.claim), and
        hands it to every rank; a sharded checkpoint's tensors every rank loads itself. False:
        none, the run starts from scratch."""
        found, error = None, None
        if self.is_main:
            try:
                found = self._claim()
            except (OSError, sharded_checkpoint.ReshardRefused) as failure:
                # every rank must hear of it, or the others wait in the broadcast
                error = f"checkpoint_dir {self.directory}: {failure}"
        found, error = distributed.broadcast_object((found, error))
        if error:
            raise RunConfigError(error)
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", self.directory)
            return False
        state, path = found
        self._load(state, path)
        position = self.run_state.position
        log.info(
            "resumed from %s: epoch %d, step %d of it, global step %d",
            path,
            position.epoch + 1,
            position.step,
            position.global_step,
        )
        return True

    def _claim(self):
        s = self.settings
        if self.sharded:
            return sharded_checkpoint.claim(self.directory, s.run_config)
        return checkpoint.claim(self.directory, s.config_hash, s.epochs, s.run_config)

    def _load(self, state: dict[str, Any], path) -> None:
        if self.sharded:
            sharded_checkpoint.load(path, self.model, self.optimizer)
        else:
            saved = {name: tuple(tensor.shape) for name, tensor in state["model"].items()}
            policy.check_fits(path, saved, self.model.state_dict())  # names the checkpoint
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if len(state["rng"]) == self.world_size:
            policy.set_rng_state(state["rng"][self.rank])
        else:  # resharded: the data order does not depend on it (scalestudy.workloads.gpt.loader)
            log.info("resharded: random number generators stay seeded from seed=%d", self.settings.seed)
        self.run_state.load_state_dict(state)
        self.run_state.mark_resumed()

    def save(self) -> None:
        """A checkpoint at the run state's position (a collective: every rank calls it)."""
        rng_states = distributed.all_gather_object(policy.rng_state())
        position = self.run_state.position
        run_state = self.run_state.state_dict()
        state = {
            "config_hash": self.settings.config_hash,
            "run_config": self.settings.run_config,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "position": run_state["position"],
            "sampler": {
                "loader": self.settings.loader,
                "seed": self.settings.seed,
                "epoch": position.epoch,
                "start_step": position.step,
                "world_size": self.world_size,
            },
            "rng": rng_states,
            "epoch_progress": run_state["epoch_progress"],
            "history": run_state["history"],
        }
        if self.sharded:  # a collective: every rank writes its shards
            state["resume_hash"] = sharded_checkpoint.resume_hash(self.settings.run_config)
            path = sharded_checkpoint.save(
                self.directory, position.global_step, self.model, self.optimizer, state, self.is_main
            )
        elif self.is_main:
            state |= {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            path = checkpoint.save(self.directory, state, position.global_step)
        else:
            return
        log.info("checkpoint %s", path)

    def finish(self) -> None:
        """The run wrote its outputs: its checkpoints go, or with keep_checkpoints stay marked finished."""
        keep = self.settings.keep
        if self.sharded:
            sharded_checkpoint.finished(self.directory, keep)
        else:
            checkpoint.finished(self.directory, self.settings.config_hash, keep)
