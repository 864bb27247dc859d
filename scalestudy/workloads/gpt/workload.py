"""A GPT-style decoder LM (scalestudy.workloads.gpt.model) on a byte-tokenised corpus, counted in
tokens: a sample is one token predicted, so throughput is tokens/s and MFU uses the FLOPs per token
(6 N plus attention, gpt_model.train_flops_per_token)."""

from __future__ import annotations

from typing import Any

import torch

from scalestudy.plan.runconfig import RunConfigError
from scalestudy.train.built import Built
from scalestudy.workloads.gpt import model as gpt_model
from scalestudy.workloads.gpt.loader import TokenLoader, load_tokens, read_manifest


def model_config(config: dict[str, Any]) -> gpt_model.GPTConfig:
    vocab_size = read_manifest(config["data_dir"])["vocab_size"]
    try:
        return gpt_model.config_from(config["gpt"] or {"preset": "demo"}, vocab_size)
    except ValueError as error:
        raise RunConfigError(f"run config gpt: {error}") from None


def build_data(config: dict[str, Any], rank: int, world_size: int, device: torch.device):
    seq_len = model_config(config).seq_len
    common = {"seq_len": seq_len, "batch_size": config["per_gpu_batch"], "rank": rank}
    common |= {"world_size": world_size, "seed": config["seed"], "device": device}
    try:
        train = TokenLoader(
            load_tokens(config["data_dir"], "train"),
            train=True,
            max_steps=config["max_steps_per_epoch"],
            **common,
        )
        test = TokenLoader(
            load_tokens(config["data_dir"], "test"),
            train=False,
            max_steps=config["eval_max_batches"],
            **common,
        )
    except ValueError as error:
        raise RunConfigError(f"data_dir {config['data_dir']}: {error}") from None
    return train, test


def build_model(config: dict[str, Any], device: torch.device) -> Built:
    cfg = model_config(config)
    net = gpt_model.GPT(cfg).to(device)
    parameters = gpt_model.count_parameters(net)
    description = (
        f"GPT decoder, {cfg.layers} layers x d_model {cfg.d_model} x {cfg.heads} heads, seq {cfg.seq_len}, "
        f"vocab {cfg.vocab_size}, {parameters:,} parameters, "
        f"{gpt_model.train_flops_per_token(cfg) / 1e6:.2f} MFLOP per token trained"
    )
    return Built(
        net,
        parameters,
        gpt_model.forward_flops_per_token(cfg),
        gpt_model.train_flops_per_token(cfg),
        description,
        shard_units=list(net.blocks),
    )


def batch_capacity(config: dict[str, Any]) -> tuple[int, str, int, str]:
    """(windows the training tokens hold, words, windows one global batch needs, words): the token
    loader's count (windows of seq_len + 1 tokens; scalestudy.train.datafit)."""
    batch, ranks = config["per_gpu_batch"], config["world_size"]
    window = model_config(config).seq_len + 1
    tokens = len(load_tokens(config["data_dir"], "train"))
    have, unit = tokens // window, f"windows of seq_len + 1 = {window} tokens ({tokens} tokens)"
    return have, unit, batch * ranks, f"one global batch of per_gpu_batch={batch} x {ranks} ranks"
