"""Test-time augmentation: evaluation, like training, sees each image in the poses it was trained on; and which of
the recipe's metrics were fed."""

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import Metric


def fed(trainer: Any, metric: Metric) -> bool:
    """Whether ``metric`` saw a batch on any DDP rank (one sync): a step of a subclass's own that does not call
    ``super()`` feeds the recipe's none, and logged they would say 0 or NaN; all ranks decide alike, since a metric
    logged on some ranks alone would leave the others waiting for it."""
    return trainer.strategy.reduce_boolean_decision(bool(metric.update_count), all=False)


def multi_crop_logits(
    forward: Callable[[torch.Tensor], torch.Tensor], images: torch.Tensor, flip: bool, translate: int = 0
) -> torch.Tensor:
    """The logits of ``images`` (B, K): ``forward``'s, averaged with the mirror image's when ``flip``; with
    ``translate`` pixels, half of the weight goes to the image as it is and half to the mean of its two
    diagonal shifts (each with its mirror too), as airbench evaluates: the centred view counts most."""

    def views(batch: torch.Tensor) -> torch.Tensor:
        logits = forward(batch)
        return (logits + forward(batch.flip(-1))) / 2 if flip else logits

    logits = views(images)
    if translate:
        height, width = images.shape[-2:]
        if not 0 < translate < min(height, width):  # reflect padding mirrors pixels inside the image
            raise ValueError(f"tta_translate={translate} must be from 1 to {min(height, width) - 1} pixels (0: none)")
        padded = F.pad(images, (translate,) * 4, mode="reflect")  # (B, C, H + 2p, W + 2p)
        shifts = [padded[..., :height, :width], padded[..., 2 * translate :, 2 * translate :]]  # up-left, down-right
        logits = (logits + torch.stack([views(crop) for crop in shifts]).mean(0)) / 2
    return logits
