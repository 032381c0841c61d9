"""BasicBlock ResNets (He et al., 2016) with a CIFAR-style stem, one 3x3 convolution at stride 1: small images (8x8
digits, 32x32 CIFAR) would lose most of their pixels to ImageNet's 7x7 conv and max-pool."""

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with a residual connection; ``stride`` 2 halves height and width."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        # bias=False: the BatchNorm right after each conv has its own shift.
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()  # not inplace: the input is still needed by the shortcut

        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:  # a 1x1 projection only where the shape changes (option B)
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A BasicBlock ResNet for image classification, returning raw logits; global average pooling before the head
    makes every input size work.

    Args:
        num_classes, in_channels: linked from the DataModule by the CLI.
        widths: output channels of each stage; every stage after the first halves height and width.
        blocks_per_stage: number of BasicBlocks in each stage, one entry per width.
        stem_width: channels of the 3x3 stem convolution; defaults to ``widths[0]``.
        checkpoint_stages: recompute each stage's activations in the backward pass (less memory, more compute).
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        widths: Sequence[int] = (64, 128, 256, 512),
        blocks_per_stage: Sequence[int] = (2, 2, 2, 2),
        stem_width: int | None = None,
        checkpoint_stages: bool = False,
    ) -> None:
        super().__init__()
        sizes = [*widths, *blocks_per_stage, num_classes, in_channels]
        if not widths or len(widths) != len(blocks_per_stage) or min(sizes) < 1:
            raise ValueError(
                f"widths {list(widths)} and blocks_per_stage {list(blocks_per_stage)} must be non-empty, of one "
                f"positive entry per stage, and num_classes {num_classes} and in_channels {in_channels} positive"
            )
        self.checkpoint_stages = checkpoint_stages
        stem_width = stem_width or widths[0]
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, stem_width, 3, padding=1, bias=False),
            nn.BatchNorm2d(stem_width),
            nn.ReLU(),
        )
        self.stages = nn.ModuleList()
        channels = stem_width
        for index, (width, blocks) in enumerate(zip(widths, blocks_per_stage)):
            first = BasicBlock(channels, width, stride=1 if index == 0 else 2)
            self.stages.append(nn.Sequential(first, *(BasicBlock(width, width) for _ in range(blocks - 1))))
            channels = width
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(channels, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                # He et al. (2015): keeps activation variance constant through ReLU layers.
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The last stage's feature map, before pooling and the head (as timm's ``forward_features``)."""
        x = self.stem(x)  # (B, stem_width, H, W)
        for stage in self.stages:
            if self.checkpoint_stages and torch.is_grad_enabled():
                x = checkpoint(stage, x, use_reentrant=False)
            else:
                x = stage(x)
        return x  # (B, widths[-1], H / 2**(stages-1), W / 2**(stages-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.forward_features(x)).flatten(1)  # (B, widths[-1])
        return self.head(x)  # (B, num_classes) raw logits: the loss applies log-softmax itself


class ResNetSmall(ResNet):
    """Three narrow stages of one block each (~0.2 M parameters): the default for small images."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, checkpoint_stages: bool = False) -> None:
        super().__init__(num_classes, in_channels, (32, 64, 128), (1, 1, 1), checkpoint_stages=checkpoint_stages)


class ResNet9(ResNet):
    """ResNet-9 style, as in the fast CIFAR-10 recipes: a 64-wide stem, then one BasicBlock of each of widths
    128, 256 and 512 (4.8 M parameters)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, checkpoint_stages: bool = False) -> None:
        super().__init__(num_classes, in_channels, (128, 256, 512), (1, 1, 1), 64, checkpoint_stages)


class ResNet18(ResNet):
    """The ResNet-18 layout, widths 64-512, two blocks a stage (11 M parameters)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, checkpoint_stages: bool = False) -> None:
        super().__init__(num_classes, in_channels, (64, 128, 256, 512), (2, 2, 2, 2), None, checkpoint_stages)


class ResNet34(ResNet):
    """The ResNet-34 layout, widths 64-512, blocks 3-4-6-3 (21 M parameters)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, checkpoint_stages: bool = False) -> None:
        super().__init__(num_classes, in_channels, (64, 128, 256, 512), (3, 4, 6, 3), None, checkpoint_stages)
