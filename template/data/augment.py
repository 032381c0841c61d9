"""Batched augmentation as tensor ops, run on the training device after transfer.

Working on a whole (B, C, H, W) batch at once replaces thousands of per-image PIL calls
in DataLoader workers with a handful of kernel launches. Randomness comes from the
global torch generator of the batch's device, which ``seed_everything`` seeds.
"""

import torch
import torch.nn.functional as F


def random_crop(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Pad each image by ``padding`` pixels (reflect) and crop it back at a random offset."""
    if padding == 0:
        return images
    batch, channels, height, width = images.shape
    padded = F.pad(images, (padding, padding, padding, padding), mode="reflect")  # (B, C, H+2p, W+2p)
    top = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (batch, 1), device=images.device)
    rows = top + torch.arange(height, device=images.device)  # (B, H)
    cols = left + torch.arange(width, device=images.device)  # (B, W)
    batch_index = torch.arange(batch, device=images.device)[:, None, None, None]
    channel_index = torch.arange(channels, device=images.device)[None, :, None, None]
    return padded[batch_index, channel_index, rows[:, None, :, None], cols[:, None, None, :]]


def random_hflip(images: torch.Tensor, probability: float = 0.5) -> torch.Tensor:
    """Mirror each image left-right with the given probability."""
    flip = torch.rand(images.shape[0], device=images.device) < probability
    return torch.where(flip[:, None, None, None], images.flip(3), images)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Scale uint8 or [0, 1] float images to zero mean and unit variance per channel."""
    if images.dtype == torch.uint8:
        images = images.float().div_(255)
    return (images - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
