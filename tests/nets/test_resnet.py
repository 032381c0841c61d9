import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from template.nets import (  # one name a line: a renamed project's longer package name stays within the limit
    BasicBlock,
    ResNet,
    ResNet9,
    ResNet18,
    ResNet34,
    ResNetSmall,
)


@pytest.mark.parametrize("preset", [ResNetSmall, ResNet9, ResNet18, ResNet34])
@pytest.mark.parametrize("size", [(8, 8), (32, 32), (7, 13), (1, 1)])
def test_presets_give_finite_logits_for_any_input_size(preset, size):
    net = preset(num_classes=7, in_channels=2)
    logits = net(torch.randn(2, 2, *size))
    assert logits.shape == (2, 7)
    assert torch.isfinite(logits).all()


def test_preset_layouts_match_the_papers():
    def blocks(net):
        return [len(stage) for stage in net.stages]

    assert blocks(ResNet18()) == [2, 2, 2, 2]
    assert blocks(ResNet34()) == [3, 4, 6, 3]
    assert blocks(ResNet9()) == [1, 1, 1] and ResNet9().stem[0].out_channels == 64
    assert sum(p.numel() for p in ResNet18(num_classes=10).parameters()) == pytest.approx(11.17e6, rel=0.01)


def test_forward_features_is_the_map_the_head_pools():
    net = ResNetSmall(num_classes=10, in_channels=3).eval()
    images = torch.randn(2, 3, 16, 16)
    features = net.forward_features(images)
    assert features.shape == (2, 128, 4, 4)  # two halvings after the first stage
    assert torch.allclose(net(images), net.head(features.mean((2, 3))), atol=1e-6)


def test_shortcut_projects_only_when_shape_changes():
    assert isinstance(BasicBlock(16, 16).shortcut, nn.Identity)
    for block in (BasicBlock(16, 32), BasicBlock(16, 16, stride=2)):
        conv, norm = block.shortcut
        assert isinstance(conv, nn.Conv2d) and conv.kernel_size == (1, 1) and isinstance(norm, nn.BatchNorm2d)
    out = BasicBlock(16, 32, stride=2)(torch.randn(2, 16, 9, 9))
    assert out.shape == (2, 32, 5, 5)


def test_initialisation_statistics():
    torch.manual_seed(0)
    net = ResNet(num_classes=100, in_channels=3, widths=(64, 256), blocks_per_stage=(1, 1))
    conv = net.stages[1][0].conv2  # 256 -> 256, 3x3: large enough for tight statistics
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx(math.sqrt(2 / fan_out), rel=0.03)
    assert conv.weight.mean().item() == pytest.approx(0, abs=0.002)
    for module in net.modules():
        if isinstance(module, nn.BatchNorm2d):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0)
    bound = math.sqrt(6 / (net.head.in_features + net.head.out_features))  # Xavier uniform
    assert net.head.weight.abs().max().item() <= bound
    assert net.head.weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert torch.all(net.head.bias == 0)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = ResNetSmall(num_classes=5, in_channels=1)
    checkpointed = ResNetSmall(num_classes=5, in_channels=1, checkpoint_stages=True)
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(4, 1, 8, 8)
    for net in (plain, checkpointed):
        net(images).square().sum().backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_bad_layouts_are_refused_with_the_values():
    with pytest.raises(ValueError, match=r"\[64, 128\].*\[2\]"):
        ResNet(widths=(64, 128), blocks_per_stage=(2,))
    with pytest.raises(ValueError, match="positive"):
        ResNet(num_classes=0)


def test_network_code_does_not_import_lightning():
    code = "import sys, template.nets; print(sorted(m for m in sys.modules if m.startswith('lightning')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
