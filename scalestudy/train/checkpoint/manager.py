"""Resume and checkpoints of a run, as a part of the Trainer: rank 0 claims the interrupted
attempt's checkpoint (scalestudy.train.checkpoint.single_file: one file; scalestudy.train.checkpoint.dcp:
DCP folders for
workloads that reshard) and hands it to every rank; every checkpoint holds the position, the epoch's
totals so far, the history and every rank's RNG state."""

from __future__ import annotations

import logging
from dataclasses import asdict

from scalestudy.launch import rendezvous as distributed
from scalestudy.plan.runconfig import RunConfigError
from scalestudy.train.checkpoint import dcp as sharded_checkpoint
from scalestudy.train.checkpoint import single_file as checkpoint
from scalestudy.train.state import EpochProgress, History, Position

log = logging.getLogger("scalestudy.train")


class RunCheckpoints:
    """The Trainer's resume and checkpoint methods (scalestudy.train.trainer.Trainer derives from it)."""

    def resume(self) -> None:
        """Rank 0 claims the checkpoint of this run's interrupted attempt, if there is one (any
        other is removed: scalestudy.train.checkpoint.single_file.claim and .dcp.claim), and
        hands it to every rank; a sharded checkpoint's tensors every rank loads itself."""
        found, error = None, None
        if self.is_main:
            try:
                found = self.claim_checkpoint()
            except (OSError, sharded_checkpoint.ReshardRefused) as failure:
                # every rank must hear of it, or the others wait in the broadcast
                error = f"checkpoint_dir {self.config['checkpoint_dir']}: {failure}"
        found, error = distributed.broadcast_object((found, error))
        if error:
            raise RunConfigError(error)
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", self.config["checkpoint_dir"])
            return
        state, path = found
        if self.workload.reshardable:
            sharded_checkpoint.load(path, self.model, self.optimizer)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if len(state["rng"]) == self.world_size:
            checkpoint.set_rng_state(state["rng"][self.rank])
        else:  # resharded: the data order does not depend on it (scalestudy.workloads.gpt.loader)
            log.info("resharded: random number generators stay seeded from seed=%d", self.config["seed"])
        self.position = Position(**state["position"])
        self.carry = EpochProgress(**state["epoch_progress"])
        self.history = History(**state["history"])
        self.resumed_from_step = self.position.global_step
        self.history.resumes.append(self.position.global_step)
        log.info(
            "resumed from %s: epoch %d, step %d of it, global step %d",
            path,
            self.position.epoch + 1,
            self.position.step,
            self.position.global_step,
        )

    def claim_checkpoint(self):
        c = self.config
        if self.workload.reshardable:
            return sharded_checkpoint.claim(c["checkpoint_dir"], c)
        return checkpoint.claim(c["checkpoint_dir"], self.config_hash, c["epochs"], c)

    def save_checkpoint(self, progress: EpochProgress) -> None:
        rng_states = distributed.all_gather_object(checkpoint.rng_state())
        state = {
            "config_hash": self.config_hash,
            "run_config": self.config,
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "position": asdict(self.position),
            "sampler": {
                "loader": self.config["loader"],
                "seed": self.config["seed"],
                "epoch": self.position.epoch,
                "start_step": self.position.step,
                "world_size": self.world_size,
            },
            "rng": rng_states,
            "epoch_progress": asdict(progress),
            "history": asdict(self.history) | {"elapsed_s": self.elapsed_s()},
        }
        step, directory = self.position.global_step, self.config["checkpoint_dir"]
        if self.workload.reshardable:  # a collective: every rank writes its shards
            state["resume_hash"] = sharded_checkpoint.resume_hash(self.config)
            path = sharded_checkpoint.save(directory, step, self.model, self.optimizer, state, self.is_main)
        elif self.is_main:
            state |= {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
            path = checkpoint.save(directory, state, step)
        else:
            return
        log.info("checkpoint %s", path)
