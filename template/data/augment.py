"""The one training augmentation of every source, and the normalisation after it.

Every source delivers uint8 batches (B, C, H', W') at its stored size: the training size
(H, W), or a little larger for random-resized crops. What happens to a batch from there is
defined here alone (applied by ``ImageDataModule.on_after_batch_transfer``), so one config
trains one recipe whichever path the images took:

    training:  random-resized crop to (H, W) (crop_scale, crop_ratio)
                 or centre (H, W) -> random crop (crop_padding, reflect)
               -> mirror (hflip: at random, or each image on alternate epochs)
               -> policy (TrivialAugmentWide or RandAugment), on uint8
               -> normalise -> random erasing (to the mean, 0) -> MixUp or CutMix (soft labels)
    otherwise: centre (H, W) -> normalise

A whole batch at once is a handful of kernel launches, not thousands of per-image PIL calls.
Randomness comes from the global generator of the batch's device, which ``seed_everything``
seeds; torchvision's v2 policies, erasing and mixing draw on the host, so never wait for the device.
"""

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
GROUPS = 16  # random draws per batch of the v2 transforms: see per_group
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
    """Crop each image to ``size`` (H, W) (by default its own): a random-resized crop with
    ``crop_scale``, else the centre shifted by up to ``crop_padding`` pixels; mirror half of
    them if ``hflip`` (those it marks, a (B,) bool tensor), then apply the ``policy``'s random
    operation. On uint8 too: cropping before the float copy moves a quarter of the bytes."""
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
    """(B, 4) int64 boxes (top, left, height, width): torchvision's ``RandomResizedCrop.get_params``
    drawn for a whole batch at once, from the device's generator."""
    area = torch.empty(batch, TRIES, device=device).uniform_(*scale) * (height * width)
    aspect = torch.empty(batch, TRIES, device=device).uniform_(math.log(ratio[0]), math.log(ratio[1])).exp_()
    widths = (area * aspect).sqrt_().round_()
    heights = (area / aspect).sqrt_().round_()
    fits = (widths > 0) & (widths <= width) & (heights > 0) & (heights <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # the first try that fits (argmax: the first maximum)
    found = fits.any(dim=1)
    if width / height < min(ratio):  # the fallback, as torchvision computes it
        whole = (round(width / min(ratio)), width)
    elif width / height > max(ratio):
        whole = (height, round(height * max(ratio)))
    else:
        whole = (height, width)
    heights = torch.where(found, heights.gather(1, first)[:, 0], whole[0]).long()
    widths = torch.where(found, widths.gather(1, first)[:, 0], whole[1]).long()
    position = torch.rand(batch, 2, device=device)
    top = torch.where(found, (position[:, 0] * (height - heights + 1)).long(), (height - heights) // 2)
    left = torch.where(found, (position[:, 1] * (width - widths + 1)).long(), (width - widths) // 2)
    return torch.stack([top, left, heights, widths], dim=1)


def resize_each(images: torch.Tensor, boxes: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """Each image's box (top, left, height, width) resized to ``size`` (H, W), bilinear, one image at a
    time: torchvision's ``resized_crop`` without antialiasing (a box is at most 8/7 of ``size``). On one
    thread: an image is too little work to share out (benchmarks/data_throughput.py measures it)."""
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
    """``resize_each`` in one ``grid_sample`` on float, within one level of 255 of it: on a GPU, a kernel
    per image would cost more in launches than in work."""
    # Output pixel x samples the box at left + (x + 0.5) * width / W - 0.5 (align_corners=False),
    # clamped to the box as a crop before the resize would be; then in grid_sample's [-1, 1].
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
    """torchvision's RandomResizedCrop(size, scale, ratio) on every image of a batch, each with its own box.
    On the CPU, torch's uint8 kernel image by image is several times faster than one grid_sample on float."""
    boxes = crop_boxes(len(images), *images.shape[-2:], scale, ratio, images.device)
    return (resize_each if images.device.type == "cpu" else resize_batch)(images, boxes, size)


def per_group(transform: v2.Transform, images: torch.Tensor, groups: int = GROUPS) -> torch.Tensor:
    """``transform`` applied to ``groups`` slices of the batch, each with its own random draws.

    A v2 transform draws once a call: on a whole batch, every image would get the same operation
    and magnitude. A fixed number of groups (16 cover TrivialAugment's 14 operations) keeps a few
    calls a batch at any batch size, and each image's distribution is the per-image one.
    """
    size = -(-len(images) // groups)  # ceil: no empty group
    return torch.cat([transform(group) for group in images.split(size)])


def random_erasing(images: torch.Tensor, probability: float) -> torch.Tensor:
    """Erase a random rectangle (2-33% of the area) to 0, the mean after normalisation, with the
    given probability (torchvision's RandomErasing, its defaults; Zhong et al., 2017)."""
    return per_group(v2.RandomErasing(probability), images) if probability > 0 else images


def mix(
    images: torch.Tensor, labels: torch.Tensor, num_classes: int, mixup_alpha: float, cutmix_alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp and/or CutMix (one of them a batch, at random, when both are on), as torchvision's reference
    recipes: each image blended with its neighbour in the batch, labels (B,) becoming probabilities (B, K)."""
    mixers = [mixer(alpha=alpha, num_classes=num_classes)
              for mixer, alpha in ((v2.MixUp, mixup_alpha), (v2.CutMix, cutmix_alpha)) if alpha > 0]  # fmt: skip
    if not mixers:
        return images, labels
    return v2.RandomChoice(mixers)(images, labels)


def random_crop(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Pad each image by ``padding`` pixels (reflect) and crop it back at a random offset."""
    if padding == 0:
        return images
    batch, channels, height, width = images.shape
    padded = F.pad(images, (padding,) * 4, mode="reflect")  # (B, C, H+2p, W+2p), uint8 too
    # A strided view of every window of every image, (B, 2p+1, 2p+1, C, H, W), without copying;
    # indexing it picks one window per image in a single copy.
    b_stride, c_stride, h_stride, w_stride = padded.stride()
    windows = padded.as_strided(
        (batch, 2 * padding + 1, 2 * padding + 1, channels, height, width),
        (b_stride, h_stride, w_stride, c_stride, h_stride, w_stride),
    )
    top = torch.randint(0, 2 * padding + 1, (batch,), device=images.device)
    left = torch.randint(0, 2 * padding + 1, (batch,), device=images.device)
    return windows[torch.arange(batch, device=images.device), top, left]


def random_hflip(images: torch.Tensor, probability: float = 0.5) -> torch.Tensor:
    """Mirror each image left-right with the given probability."""
    return mirror_where(images, torch.rand(images.shape[0], device=images.device) < probability)


def mirror_where(images: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    """Mirror left-right the images whose entry of ``flip`` (B,) is true."""
    # Each image picked from the batch or its mirror by index: no boolean-mask index, which makes the
    # host wait for the device every step, and on the CPU faster than torch.where's broadcast over uint8.
    choice = torch.arange(len(images), device=images.device) + len(images) * flip
    return torch.cat([images, images.flip(3)]).index_select(0, choice)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Scale uint8 or [0, 1] float images to zero mean and unit variance per channel."""
    mean, std = mean.view(1, -1, 1, 1), std.view(1, -1, 1, 1)
    if images.dtype == torch.uint8:  # one multiply and one subtract, in place on the new float copy
        return images.float().mul_(1 / (255 * std)).sub_(mean / std)
    return (images - mean) / std


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std in [0, 1] of uint8 images (N, C, H, W), in chunks (memmaps welcome).

    From each channel's histogram: exact, and 0.12 s for 2,000 images of 146x146 where float64
    sums took 1.06 (one core). Another dtype (a source that breaks the uint8 contract) is summed.
    """
    values = torch.arange(256, dtype=torch.float64) / 255
    sums = torch.zeros(2, images.shape[1], dtype=torch.float64)  # per channel: of the values, of their squares
    for start in range(0, len(images), chunk):
        block = torch.as_tensor(images[start : start + chunk])
        if block.dtype == torch.uint8:
            counts = torch.stack([torch.bincount(channel.reshape(-1), minlength=256) for channel in block.unbind(1)])
            sums += torch.stack([counts.double() @ values, counts.double() @ values.square()])
        else:
            block = block.double().div_(255)
            sums += torch.stack([block.sum(dim=(0, 2, 3)), block.square().sum(dim=(0, 2, 3))])
    mean, square = sums / (images.shape[0] * images.shape[2] * images.shape[3])
    std = (square - mean.square()).clamp_min(1e-12).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)
