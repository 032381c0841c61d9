"""The one augmentation of every source, on uint8 batches (B, C, H', W') on the device, so one config trains one
recipe whichever path the images took: ``ImageDataModule.on_after_batch_transfer`` crops, mirrors and applies the
policy (uint8), normalises, erases and mixes in training; else it centre-crops and normalises. Randomness comes from
the device's global generator (``seed_everything`` seeds it); torchvision's v2 policies, erasing and mixing draw on
the host, so never wait for the device."""

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

Policy = Literal["trivialaugment", "randaugment"]
Flip = bool | Literal["alternate"]  # "alternate": each image on alternate epochs (ResumableSampler.alternating_flips)
POLICIES = {"trivialaugment": v2.TrivialAugmentWide, "randaugment": v2.RandAugment}
RATIO = (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop aspect ratios
TRIES = 10  # torchvision's draws of a crop box before it falls back to the centre


def augment(
    images: torch.Tensor,
    crop_padding: int,
    hflip: bool | torch.Tensor,
    policy: Policy | None = None,
    size: Sequence[int] | None = None,
    crop_scale: Sequence[float] | None = None,
    crop_ratio: Sequence[float] = RATIO,
) -> torch.Tensor:
    """Crop each image to ``size`` (H, W): random-resized with ``crop_scale``, else the centre shifted by up to
    ``crop_padding``; mirror half (or those a (B,) bool ``hflip`` marks); then the ``policy``'s operation."""
    size = tuple(size or images.shape[-2:])
    if crop_scale is not None:
        images = random_resized_crop(images, size, crop_scale, crop_ratio)
    else:
        images = random_crop(center_crop(images, size), crop_padding)
    if isinstance(hflip, torch.Tensor):
        images = mirror_where(images, hflip)
    elif hflip:
        images = random_hflip(images)
    return per_group(POLICIES[policy](), images) if policy else images


def center_crop(images: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """The centre (H, W) of each image: torchvision's ``center_crop``, which would pad a smaller image."""
    height, width = images.shape[-2:]
    if height < size[0] or width < size[1]:
        raise ValueError(f"images of {height}x{width} are smaller than the {size[0]}x{size[1]} to crop from them")
    return TF.center_crop(images, list(size))


def crop_boxes(
    batch: int, height: int, width: int, scale: Sequence[float], ratio: Sequence[float], device: torch.device
) -> torch.Tensor:
    """(B, 4) boxes (top, left, height, width): torchvision's ``RandomResizedCrop.get_params`` for a batch."""
    area = torch.empty(batch, TRIES, device=device).uniform_(*scale) * (height * width)
    aspect = torch.empty(batch, TRIES, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1])).exp_()
    widths = (area * aspect).sqrt_().round_()
    heights = (area / aspect).sqrt_().round_()
    fits = (widths > 0) & (widths <= width) & (heights > 0) & (heights <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits (argmax: the first maximum)
    found = fits.any(dim=1)
    # torchvision's fallback: the largest centre box of an aspect ratio clamped to ``ratio``.
    clamped = min(max(width / height, min(ratio)), max(ratio))
    whole = (min(height, round(width / clamped)), min(width, round(height * clamped)))
    heights = torch.where(found, heights.gather(1, first)[:, 0], whole[0]).long()
    widths = torch.where(found, widths.gather(1, first)[:, 0], whole[1]).long()
    position = torch.rand(batch, 2, device=device)
    top = torch.where(found, (position[:, 0] * (height - heights + 1)).long(), (height - heights) // 2)
    left = torch.where(found, (position[:, 1] * (width - widths + 1)).long(), (width - widths) // 2)
    return torch.stack([top, left, heights, widths], dim=1)


def resize_each(images: torch.Tensor, boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Each image's box resized to ``size`` (H, W), bilinear, one image at a time on one thread (too little
    work to share out): torchvision's ``resized_crop`` without antialiasing (a box is at most 8/7 of ``size``)."""
    out = torch.empty(*images.shape[:2], *size, dtype=images.dtype, device=images.device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for index, (top, left, height, width) in enumerate(boxes.tolist()):
            crop = images[index : index + 1, :, top : top + height, left : left + width]
            out[index] = F.interpolate(crop, size=tuple(size), mode="bilinear", align_corners=False)[0]
    finally:
        torch.set_num_threads(threads)
    return out


def resize_batch(images: torch.Tensor, boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """``resize_each`` in one ``grid_sample`` (within one level of 255): on a GPU, launches per image cost more."""
    # Output pixel x samples left + (x + 0.5) * width / W - 0.5, clamped to the box, in grid_sample's [-1, 1].
    full = images.shape[-2:]
    axes = []
    for axis, steps in enumerate(size):
        start, length = boxes[:, axis, None].float(), boxes[:, axis + 2, None].float()
        at = (torch.arange(steps, device=images.device, dtype=torch.float32) + 0.5) * length / steps - 0.5
        axes.append((2 * (start + at.clamp(min=0).minimum(length - 1)) + 1) / full[axis] - 1)  # (B, steps)
    ys, xs = axes
    grid = torch.stack([xs[:, None, :].expand(-1, size[0], -1), ys[:, :, None].expand(-1, -1, size[1])], dim=-1)
    resampled = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)
    return resampled.round_().clamp_(0, 255).to(images.dtype) if images.dtype == torch.uint8 else resampled


def random_resized_crop(
    images: torch.Tensor, size: Sequence[int], scale: Sequence[float], ratio: Sequence[float] = RATIO
) -> torch.Tensor:
    """torchvision's RandomResizedCrop(size, scale, ratio), a box per image; on the CPU image by image (faster)."""
    boxes = crop_boxes(len(images), *images.shape[-2:], scale, ratio, images.device)
    return (resize_each if images.device.type == "cpu" else resize_batch)(images, boxes, size)


def per_group(transform: v2.Transform, images: torch.Tensor) -> torch.Tensor:
    """``transform`` on 16 slices of the batch (TrivialAugment's 14 operations covered), each with its own draws:
    a v2 transform draws once a call."""
    size = -(-len(images) // 16)  # ceil: no empty group
    return torch.cat([transform(group) for group in images.split(size)])


def random_erasing(images: torch.Tensor, probability: float) -> torch.Tensor:
    """torchvision's RandomErasing (Zhong et al., 2017): a rectangle to 0, the mean after normalisation."""
    return per_group(v2.RandomErasing(probability), images) if probability > 0 else images


def mix(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, mixup_alpha: float, cutmix_alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's MixUp and/or CutMix (one at random a batch); labels (B,) become probabilities (B, K)."""
    mixers = [mixer(alpha=alpha, num_classes=num_classes)
              for mixer, alpha in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha)) if alpha > 0]  # fmt: skip
    return v2.RandomChoice(mixers)(images, labels) if mixers else (images, labels)


def random_crop(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Pad each image by ``padding`` pixels (reflect) and crop it back at a random offset."""
    if padding == 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (padding,) * 4, mode="reflect")  # (B, C, H+2p, W+2p), uint8 too
    # A view of every window of every image, (B, C, 2p+1, 2p+1, H, W): indexing it copies one per image.
    windows = padded.unfold(2, height, 1).unfold(3, width, 1)
    top = torch.randint(0, 2 * padding + 1, (batch,), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (batch,), device=images.device)
    return windows[torch.arange(batch, device=images.device), :, top, left]


def random_hflip(images: torch.Tensor, probability: float = 0.5) -> torch.Tensor:
    return mirror_where(images, torch.rand(images.shape[0], device=images.device) < probability)


def mirror_where(images: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    # By index from the batch and its mirror (``flip``: (B,) bool): a boolean mask would make the host wait.
    choice = torch.arange(len(images), device=images.device) + len(images) * flip
    return torch.cat([images, images.flip(3)]).index_select(0, choice)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Scale uint8 or [0, 1] float images to zero mean and unit variance per channel."""
    mean, std = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
    if images.dtype == torch.uint8:  # one multiply and one subtract, in place on the new float copy
        return images.float().mul_(1 / (255 * std)).sub_(mean / std)
    return (images - mean) / std


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std in [0, 1] of images (N, C, H, W), in chunks (memmaps welcome): from each
    channel's histogram when uint8 (exact, and faster than float sums), else summed."""
    values = torch.arange(256, dtype=torch.float64) / 255
    sums = torch.zeros(2, images.shape[1], dtype=torch.float64)  # per channel: of the values, of their squares
    for start in range(0, len(images), chunk):
        block = torch.as_tensor(images[start : start + chunk])
        if block.dtype == torch.uint8:
            counts = torch.stack([torch.bincount(channel.reshape(-1), minlength=256) for channel in block.unbind(1)])
            sums += torch.stack([counts.double() @ values, counts.double() @ values.square()])
        else:
            block = block.double()  # floats in [0, 1], as normalize takes them
            sums += torch.stack([block.sum(dim=(0, 2, 3)), block.square().sum(dim=(0, 2, 3))])
    mean, square = sums / (images.shape[0] * images.shape[2] * images.shape[3])
    std = (square - mean.square()).clamp_min(1e-12).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)
