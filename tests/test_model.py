"""ResNet-18 CIFAR variant: size, stem, widths, FLOP count, channels_last, frozen-statistics norm; the
network written out in the package is torchvision's ResNet-18 with the CIFAR stem."""

import pytest
import torch
from torch import nn

from scalestudy.workloads.resnet_cifar.model import (
    BasicBlock,
    FrozenStatsBatchNorm2d,
    build_model,
    count_flops,
    count_flops_per_image,
    count_parameters,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_standard_width_is_the_cifar_resnet18():
    model = build_model()
    assert count_parameters(model) == 11_173_962
    assert (model.conv1.kernel_size, model.conv1.stride, model.conv1.padding) == ((3, 3), (1, 1), (1, 1))
    assert isinstance(model.maxpool, nn.Identity)
    assert model.fc.out_features == 10
    assert all(isinstance(block, BasicBlock) for layer in (model.layer1, model.layer4) for block in layer)


def _torchvision_cifar_resnet18(width: int) -> nn.Module:
    """torchvision's ResNet-18 at `width` with the CIFAR stem, as the package built it before issue 51."""
    from torchvision.models.resnet import BasicBlock as TorchvisionBlock
    from torchvision.models.resnet import ResNet

    class Reference(ResNet):
        def __init__(self):
            self.scale = width
            super().__init__(TorchvisionBlock, [2, 2, 2, 2], num_classes=10)
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
            nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
            self.bn1 = nn.BatchNorm2d(width)
            self.maxpool = nn.Identity()
            self.fc = nn.Linear(8 * width, 10)

        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            if planes == 64:
                self.inplanes = self.scale
            return super()._make_layer(block, planes * self.scale // 64, blocks, stride, dilate)

    return Reference()


@pytest.mark.parametrize("width", [8, 64])
def test_the_network_is_torchvisions_resnet18_with_the_cifar_stem(width):
    """The same modules, names, shapes and buffers as torchvision's; from one seed the same initial
    weights, bit for bit (the runs of a seed train as they did); the same outputs and gradients,
    in training mode."""
    torch.manual_seed(0)
    ours = build_model(width=width)
    torch.manual_seed(0)
    theirs = _torchvision_cifar_resnet18(width)
    mine, reference = ours.state_dict(), theirs.state_dict()
    assert list(mine) == list(reference)
    assert all(torch.equal(mine[key], reference[key]) for key in reference)
    assert [type(m).__name__ for m in ours.modules()][1:] == [
        type(m).__name__.replace("Reference", "CifarResNet") for m in theirs.modules()
    ][1:]
    theirs.load_state_dict(mine)
    x = torch.randn(4, 3, 32, 32)
    out_ours, out_theirs = ours.train()(x), theirs.train()(x)
    torch.testing.assert_close(out_ours, out_theirs, rtol=0, atol=0)
    out_ours.square().sum().backward()
    out_theirs.square().sum().backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    assert all(
        torch.equal(m.weight, torch.ones_like(m.weight))
        for m in ours.modules()
        if isinstance(m, nn.BatchNorm2d)
    )


def test_the_flop_count_runs_on_the_meta_device_and_matches_a_real_forward():
    """A job counts its FLOPs without a forward on its own device (issue 51)."""
    assert count_flops_per_image(8) == count_flops(build_model(width=8), 1)
    assert count_flops_per_image(64) == pytest.approx(1.111e9, rel=1e-3)


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
