"""GPT decoder LM: shape, causality, tied head, init, size, FLOP count, config_from, learnability."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from scalestudy.workloads.gpt.model import (
    GPT,
    PRESETS,
    Block,
    GPTConfig,
    config_from,
    count_parameters,
    forward_flops_per_token,
    parameter_count,
    train_flops_per_token,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = GPTConfig(vocab_size=32, seq_len=16, layers=2, heads=2, d_model=24)
BYTE_VOCAB = 256


def _tiny_model(seed: int = 0, cfg: GPTConfig = TINY) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def test_forward_gives_logits_per_position_and_refuses_too_long_sequences():
    model = _tiny_model()
    idx = torch.randint(0, TINY.vocab_size, (3, 10))
    assert model(idx).shape == (3, 10, TINY.vocab_size)
    with pytest.raises(ValueError, match="sequence length 17 exceeds gpt.seq_len 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_attention_is_causal():
    model = _tiny_model().eval()
    idx = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
    changed_at = 9
    other = idx.clone()
    other[:, changed_at] = (idx[:, changed_at] + 1) % TINY.vocab_size
    with torch.no_grad():
        before, after = model(idx), model(other)
    torch.testing.assert_close(before[:, :changed_at], after[:, :changed_at], rtol=0, atol=0)
    assert not torch.allclose(before[:, changed_at:], after[:, changed_at:])
    assert all(not torch.allclose(before[:, t], after[:, t]) for t in range(changed_at, TINY.seq_len))


def test_head_is_tied_to_the_token_embedding_and_counted_once():
    model = _tiny_model()
    assert model.lm_head.weight is model.token_embedding.weight
    assert model.lm_head.bias is None
    with_duplicates = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert count_parameters(model) == with_duplicates - TINY.vocab_size * TINY.d_model


def test_blocks_are_a_module_list_of_blocks_for_per_block_sharding():
    model = _tiny_model()
    assert isinstance(model.blocks, nn.ModuleList)
    assert len(model.blocks) == TINY.layers and all(isinstance(b, Block) for b in model.blocks)


def test_gpt2_init():
    cfg = GPTConfig(vocab_size=512, seq_len=64, layers=8, heads=4, d_model=256)
    model = _tiny_model(cfg=cfg)
    residual_std = 0.02 / math.sqrt(2 * cfg.layers)
    block = model.blocks[3]
    assert block.attn.proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert block.mlp.proj.weight.std().item() == pytest.approx(residual_std, rel=0.05)
    assert block.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert block.mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.token_embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.position_embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)
    biases = [m.bias for m in model.modules() if isinstance(m, nn.Linear) and m.bias is not None]
    assert len(biases) == 4 * cfg.layers and all(torch.count_nonzero(b) == 0 for b in biases)


def test_same_seed_same_init_other_seed_other_init():
    first, again, other = (
        _tiny_model(1).state_dict(),
        _tiny_model(1).state_dict(),
        _tiny_model(2).state_dict(),
    )
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not torch.equal(first["blocks.0.attn.qkv.weight"], other["blocks.0.attn.qkv.weight"])


def test_gpt2_small_has_124m_parameters():
    cfg = config_from({"preset": "gpt2-small"}, BYTE_VOCAB)
    v, t, n_layer, d = 50304, 1024, 12, 768
    # embeddings; per block: 2 LayerNorms (4d), qkv (3d^2 + 3d), attention out (d^2 + d),
    # MLP in (4d^2 + 4d), MLP out (4d^2 + d); final LayerNorm (2d); the head is the token embedding
    closed_form = v * d + t * d + n_layer * (12 * d * d + 13 * d) + 2 * d
    assert closed_form == 124_475_904
    with torch.device("meta"):  # no memory, no init work
        model = GPT(cfg)
    assert count_parameters(model) == closed_form == parameter_count(cfg)
    assert abs(closed_form - 124e6) < 1e6


@pytest.mark.parametrize("cfg", [TINY, GPTConfig(vocab_size=100, seq_len=8, layers=3, heads=3, d_model=12)])
def test_parameter_count_closed_form_matches_the_model(cfg):
    assert parameter_count(cfg) == count_parameters(_tiny_model(cfg=cfg))
    assert parameter_count(cfg, position_embedding=False) == parameter_count(cfg) - cfg.seq_len * cfg.d_model


def test_demo_preset_is_1_to_3m_parameters():
    cfg = config_from({"preset": "demo"}, BYTE_VOCAB)
    assert cfg.vocab_size == BYTE_VOCAB and cfg.seq_len == 128
    assert 1_000_000 <= count_parameters(_tiny_model(cfg=cfg)) <= 3_000_000


def test_flops_per_token_by_hand():
    cfg = GPTConfig(vocab_size=10, seq_len=4, layers=1, heads=1, d_model=2)
    # N without positions: token embedding 10*2 = 20; block 12*2^2 + 13*2 = 74; final LayerNorm 4 -> 98
    # train: 6 * 98 + 12 * 1 * 2 * 4 = 588 + 96 = 684; forward: a third
    assert train_flops_per_token(cfg) == 684
    assert forward_flops_per_token(cfg) == 228


def test_forward_flops_agree_with_torch_flop_counter():
    """torch counts the matmuls only (not biases or LayerNorms), and attention in full on the math path."""
    model = _tiny_model()
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, TINY.seq_len, dtype=torch.long))
    d, layers = TINY.d_model, TINY.layers
    uncounted_per_token = 2 * (13 * d * layers + 2 * d)
    assert counter.get_total_flops() == TINY.seq_len * (forward_flops_per_token(TINY) - uncounted_per_token)


def test_config_from_preset_overrides_and_vocab():
    assert config_from({"preset": "demo", "layers": 2, "dropout": 0.1}, BYTE_VOCAB) == GPTConfig(
        vocab_size=256, seq_len=128, layers=2, heads=4, d_model=PRESETS["demo"]["d_model"], dropout=0.1
    )
    explicit = {"layers": 1, "heads": 2, "d_model": 8, "seq_len": 4}
    assert config_from(explicit, 300).vocab_size == 300
    assert config_from({**explicit, "vocab_size": None}, 300).vocab_size == 300
    assert config_from({**explicit, "vocab_size": 512}, 300).vocab_size == 512
    assert config_from({"preset": "gpt2-small"}, BYTE_VOCAB).vocab_size == 50304
    assert config_from({"preset": "gpt2-small", "vocab_size": None}, BYTE_VOCAB).vocab_size == BYTE_VOCAB


@pytest.mark.parametrize(
    "section, message",
    [
        ({"preset": "demo", "layer": 2, "width": 3}, "unknown key\\(s\\) layer, width"),
        ({"preset": "gpt3"}, "gpt.preset: unknown preset 'gpt3'"),
        ({"layers": 1, "heads": 1}, "missing key\\(s\\) seq_len, d_model"),
        ({"preset": "demo", "vocab_size": 100}, "gpt.vocab_size \\(100\\) is smaller than the tokenizer's"),
        ({"preset": "demo", "heads": 5}, "gpt.d_model \\(192\\) must be a multiple of gpt.heads \\(5\\)"),
        ({"preset": "demo", "layers": 0}, "gpt.layers must be a positive integer, got 0"),
        ({"preset": "demo", "seq_len": 12.5}, "gpt.seq_len must be a positive integer"),
        ({"preset": "demo", "d_model": True}, "gpt.d_model must be a positive integer"),
        ({"preset": "demo", "dropout": 1.0}, "gpt.dropout must be a number in \\[0, 1\\)"),
        ({"preset": "demo", "dropout": "0.1"}, "gpt.dropout must be a number"),
    ],
)
def test_config_from_rejects_bad_sections(section, message):
    with pytest.raises(ValueError, match=message):
        config_from(section, BYTE_VOCAB)


def test_learns_a_repetitive_sequence():
    model = _tiny_model(3)
    tokens = torch.arange(8).repeat(5)[: TINY.seq_len + 1].expand(4, -1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    first = loss().item()
    for _ in range(30):
        optimizer.zero_grad()
        step_loss = loss()
        step_loss.backward()
        optimizer.step()
    assert first == pytest.approx(math.log(TINY.vocab_size), rel=0.1)  # a small init predicts ~uniformly
    assert loss().item() < 0.1 * first
