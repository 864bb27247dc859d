"""A GPT-style decoder LM (GPT-2's layout, after nanoGPT's model.py) and its FLOP count.

Token + learned position embeddings, `layers` pre-norm blocks (LayerNorm -> causal self-attention ->
residual; LayerNorm -> 4x MLP with GELU -> residual), a final LayerNorm and an output head tied to the
token embedding. `GPT.blocks` is a ModuleList of blocks so that FSDP2 can shard block by block
(`fully_shard(block)` for each, then `fully_shard(model)`). The loss is the trainer's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from scalestudy.workloads.gpt.presets import PRESETS

MLP_RATIO = 4
INIT_STD = 0.02  # GPT-2's


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    layers: int
    heads: int
    d_model: int
    dropout: float = 0.0

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        for key in ("vocab_size", "seq_len", "layers", "heads", "d_model"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"gpt.{key} must be a positive integer, got {value!r}")
        if self.d_model % self.heads:
            raise ValueError(f"gpt.d_model ({self.d_model}) must be a multiple of gpt.heads ({self.heads})")
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
            raise ValueError(f"gpt.dropout must be a number in [0, 1), got {dropout!r}")


def config_from(section: dict[str, Any], vocab_size: int) -> GPTConfig:
    """The run config's `gpt` object -> GPTConfig.

    `preset` (optional) names an entry of PRESETS; the section's own keys override it. A vocab_size
    that is absent from both, or null, becomes the tokenizer's `vocab_size`; one given must cover it.
    """
    known = {field.name for field in fields(GPTConfig)}
    unknown = sorted(set(section) - known - {"preset"})
    if unknown:
        raise ValueError(
            f"gpt: unknown key(s) {', '.join(unknown)}; known: preset, {', '.join(sorted(known))}"
        )
    preset = section.get("preset")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"gpt.preset: unknown preset {preset!r}, one of {', '.join(PRESETS)}")
    merged = {**PRESETS.get(preset, {}), **{k: v for k, v in section.items() if k != "preset"}}
    if merged.get("vocab_size") is None:
        merged["vocab_size"] = vocab_size
    missing = [name for name in ("seq_len", "layers", "heads", "d_model") if name not in merged]
    if missing:
        raise ValueError(f"gpt: missing key(s) {', '.join(missing)} (give them, or a preset)")
    config = GPTConfig(**merged)
    if config.vocab_size < vocab_size:
        raise ValueError(
            f"gpt.vocab_size ({config.vocab_size}) is smaller than the tokenizer's ({vocab_size})"
        )
    return config


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.proj.is_residual_projection = True
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time, self.heads, channels // self.heads).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(batch, time, channels)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, MLP_RATIO * cfg.d_model)
        self.proj = nn.Linear(MLP_RATIO * cfg.d_model, cfg.d_model)
        self.proj.is_residual_projection = True
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        return x + self.mlp(self.ln_mlp(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position_embedding = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_final = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's init; the projections into the residual stream shrink with depth (1/sqrt(2 layers))."""
        if isinstance(module, nn.Linear):
            std = (
                INIT_STD / math.sqrt(2 * self.cfg.layers)
                if hasattr(module, "is_residual_projection")
                else INIT_STD
            )
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids [batch, time] (int64) -> logits [batch, time, vocab_size]."""
        time = idx.shape[1]
        if time > self.cfg.seq_len:
            raise ValueError(f"sequence length {time} exceeds gpt.seq_len {self.cfg.seq_len}")
        positions = torch.arange(time, device=idx.device)
        x = self.dropout(self.token_embedding(idx) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_final(x))


def count_parameters(model: nn.Module) -> int:
    """Unique parameters: the head's weight, tied to the token embedding, counts once."""
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once


def parameter_count(cfg: GPTConfig, position_embedding: bool = True) -> int:
    """count_parameters(GPT(cfg)) in closed form, without building the model."""
    d = cfg.d_model
    per_block = (
        2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + 2 * (MLP_RATIO * d * d) + MLP_RATIO * d + d
    )
    positions = cfg.seq_len * d if position_embedding else 0
    return cfg.vocab_size * d + positions + cfg.layers * per_block + 2 * d


def train_flops_per_token(cfg: GPTConfig) -> int:
    """Training FLOPs (forward + backward) per token at full context: 6 N + 12 layers d_model seq_len.

    N counts the parameters without the position embedding (a lookup, no multiply-adds) and with the
    tied token embedding once, as the output head's matmul; this is nanoGPT's estimate_mfu convention
    (PaLM's appendix B), so MFU figures compare with nanoGPT's. The second term is attention's
    QK^T and AV products, counted for the full (not causally halved) T x T score matrix.
    """
    n = parameter_count(cfg, position_embedding=False)
    return 6 * n + 12 * cfg.layers * cfg.d_model * cfg.seq_len


def forward_flops_per_token(cfg: GPTConfig) -> int:
    """Forward FLOPs per token: a third of train_flops_per_token (backward costs twice the forward)."""
    return train_flops_per_token(cfg) // 3
