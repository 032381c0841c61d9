"""airbench94's network (Keller Jordan, "94% on CIFAR-10 in 3.29 Seconds on a Single GPU", arXiv 2404.00498),
written from the paper's description: a frozen 2x2 patch-whitening stem, three blocks of two 3x3
convolutions (the first of each followed by a 2x2 max-pool), BatchNorm with a frozen scale, GELU, a global
max-pool and a linear head without bias whose logits are scaled down. 0.24 GFLOP a 32x32 image forward."""

from collections.abc import Sequence

import torch
from torch import nn

from template.nets.layers import FrozenWeightBatchNorm, WhiteningConv, identity_init_


class ConvGroup(nn.Sequential):
    """conv3x3 -> max-pool 2 -> BN -> GELU -> conv3x3 -> BN -> GELU (no biases: the BatchNorms shift)."""

    def __init__(self, in_channels: int, out_channels: int, identity_init: bool, **norm) -> None:
        convs = [nn.Conv2d(c, out_channels, 3, padding=1, bias=False) for c in (in_channels, out_channels)]
        if identity_init:
            convs = [identity_init_(conv) for conv in convs]
        pool, norms = nn.MaxPool2d(2), [FrozenWeightBatchNorm(out_channels, **norm) for _ in range(2)]
        super().__init__(convs[0], pool, norms[0], nn.GELU(), convs[1], norms[1], nn.GELU())


class AirbenchNet(nn.Module):
    """airbench94's network: (B, C, H, W) normalised images to (B, num_classes) logits.

    Args:
        widths: output channels of the three blocks; each block halves height and width.
        whiten_kernel, whiten_eps, whiten_images: of the whitening stem (``template.nets.layers.WhiteningConv``).
        identity_init: every convolution after the stem starts as the identity (``identity_init_``).
        bn_momentum, bn_eps, bias_lr_scale: of every BatchNorm (``FrozenWeightBatchNorm``).
        logit_scale: multiplies the logits: with label smoothing, a milder temperature that the large learning
            rate cannot blow up.
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        widths: Sequence[int] = (64, 256, 256),
        whiten_kernel: int = 2,
        whiten_eps: float = 5e-4,
        whiten_images: int = 5000,
        identity_init: bool = True,
        bn_momentum: float = 0.4,
        bn_eps: float = 1e-12,
        bias_lr_scale: float = 64.0,
        logit_scale: float = 1 / 9,
    ) -> None:
        super().__init__()
        self.whiten = WhiteningConv(in_channels, whiten_kernel, whiten_eps, whiten_images)
        self.act = nn.GELU()
        norm = {"momentum": bn_momentum, "eps": bn_eps, "bias_lr_scale": bias_lr_scale}
        channels = [self.whiten.out_channels, *widths]
        self.blocks = nn.Sequential(*(ConvGroup(a, b, identity_init, **norm) for a, b in zip(channels, channels[1:])))
        self.head = nn.Linear(channels[-1], num_classes, bias=False)
        self.logit_scale = logit_scale

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.act(self.whiten(images)))  # (B, widths[-1], H', W')
        return self.head(features.amax(dim=(2, 3))) * self.logit_scale  # global max-pool: (B, num_classes)
