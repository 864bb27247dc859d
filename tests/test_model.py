"""ResNet-18 CIFAR variant: size, stem, widths, FLOP count, channels_last, frozen-statistics norm."""

import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from scalestudy.workloads.resnet_cifar.model import (
    FrozenStatsBatchNorm2d,
    build_model,
    count_flops,
    count_parameters,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_standard_width_is_the_cifar_resnet18():
    model = build_model()
    assert isinstance(model, ResNet)
    assert count_parameters(model) == 11_173_962
    assert (model.conv1.kernel_size, model.conv1.stride, model.conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 10
    assert all(isinstance(block, BasicBlock) for layer in (model.layer1, model.layer4) for block in layer)


def test_width_scales_every_stage():
    model = build_model(width=8)
    stage_widths = [
        layer[-1].conv2.out_channels for layer in (model.layer1, model.layer2, model.layer3, model.layer4)
    ]
    assert stage_widths == [8, 16, 32, 64]
    assert model.conv1.out_channels == 8 and model.fc.in_features == 64
    assert model.layer1[0].downsample is None  # the stem already gives stage 1 its width
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def _conv_and_linear_flops(model: nn.Module, images: int) -> int:
    """Independent count: 2 x multiply-adds of every conv and linear layer, from forward hooks."""
    total = 0

    def hook(module, inputs, output):
        nonlocal total
        if isinstance(module, nn.Conv2d):
            k = module.kernel_size[0] * module.kernel_size[1] * module.in_channels // module.groups
            total += 2 * output.numel() * k
        else:
            total += 2 * output.numel() * module.in_features

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    with torch.no_grad():
        model.eval()(torch.zeros(images, 3, 32, 32))
    for handle in handles:
        handle.remove()
    return total


def test_flop_count_matches_layer_by_layer_count_and_scales_with_batch():
    model = build_model()
    per_image = count_flops(model, 1)
    assert per_image == _conv_and_linear_flops(model, 1)
    assert per_image == pytest.approx(1.111e9, rel=1e-3)
    small = build_model(width=8)
    assert count_flops(small, 3) == 3 * count_flops(small, 1)
    assert small.training  # count_flops leaves the mode as it found it


def test_channels_last_gives_the_same_outputs():
    torch.manual_seed(0)
    model = build_model(width=8).eval()
    fast = build_model(width=8, channels_last=True).eval()
    fast.load_state_dict(model.state_dict())
    assert fast.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 32, 32)
    torch.testing.assert_close(
        fast(x.contiguous(memory_format=torch.channels_last)), model(x), rtol=1e-4, atol=1e-5
    )


def test_frozen_norm_makes_each_output_independent_of_the_batch():
    torch.manual_seed(0)
    x = torch.randn(8, 3, 32, 32)
    frozen = build_model(width=8, norm="frozen").train()
    assert any(isinstance(m, FrozenStatsBatchNorm2d) for m in frozen.modules())
    torch.testing.assert_close(frozen(x)[:4], frozen(x[:4]))
    running = frozen.bn1.running_mean.clone()
    frozen(x)
    assert torch.equal(frozen.bn1.running_mean, running)
    assert frozen.bn1.weight.requires_grad
    plain = build_model(width=8, norm="batch").train()
    assert not torch.allclose(plain(x)[:4], plain(x[:4]), atol=1e-3)  # batch statistics couple samples


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"width": 0}, "width=0"), ({"norm": "group"}, "norm='group'")]
)
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_model(**kwargs)
