"""The one training augmentation of every source, and the normalisation after it.

Every source delivers the same thing to the device: uint8 batches (B, C, H, W) already at
the training size (decoded and resized to cover it, then centre-cropped: by the cache
build, by a source's ``load_split``, or by the DataLoader workers when streaming). What
happens to a batch from there is defined here alone and applied by
``ImageDataModule.on_after_batch_transfer``, so one config trains one recipe whichever
path the images took:

    training:  random crop (crop_padding, reflect) -> random mirror (hflip)
               -> policy (TrivialAugmentWide or RandAugment), on uint8
               -> normalise -> random erasing (to the mean, 0) -> MixUp or CutMix (soft labels)
    otherwise: normalise

Working on a whole batch at once replaces thousands of per-image PIL calls in DataLoader
workers with a handful of kernel launches. Randomness comes from the global torch
generator of the batch's device, which ``seed_everything`` seeds and an exact resume
relies on. The policies, erasing and mixing are torchvision's (transforms v2), which draw
their parameters on the host, from torch's global CPU generator: seeded and checkpointed
alike, and no wait for the device.
"""

from typing import Literal

import torch
from torchvision.transforms import v2

Policy = Literal["trivialaugment", "randaugment"]
POLICIES = {"trivialaugment": v2.TrivialAugmentWide, "randaugment": v2.RandAugment}
GROUPS = 16  # random draws per batch of the v2 transforms: see per_group


def augment(images: torch.Tensor, crop_padding: int, hflip: bool, policy: Policy | None = None) -> torch.Tensor:
    """Randomly shift each image by up to ``crop_padding`` pixels, mirror half of them if ``hflip``,
    then apply the ``policy``'s random operation.

    Runs on uint8 as well as float: cropping before the float copy moves a quarter of the bytes.
    """
    images = random_crop(images, crop_padding)
    images = random_hflip(images) if hflip else images
    return per_group(POLICIES[policy](), images) if policy else images


def per_group(transform: v2.Transform, images: torch.Tensor, groups: int = GROUPS) -> torch.Tensor:
    """``transform`` applied to ``groups`` slices of the batch, each with its own random draws.

    A v2 transform draws once a call: on a whole batch, every image would get the same
    operation and magnitude (or erased rectangle), and the batch one correlated view. Per
    image would be a call per image; a fixed number of groups (16 cover TrivialAugment's 14
    operations) keeps a few calls a batch at any batch size. Each image's own distribution is
    the per-image one, since groups are drawn anew from a shuffled order every step.
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


def reflect_pad(images: torch.Tensor, padding: int) -> torch.Tensor:
    """F.pad(mode="reflect") for any dtype, uint8 included, so crops can run before the float copy."""
    images = torch.cat([images[:, :, 1 : padding + 1].flip(2), images, images[:, :, -padding - 1 : -1].flip(2)], 2)
    return torch.cat([images[..., 1 : padding + 1].flip(3), images, images[..., -padding - 1 : -1].flip(3)], 3)


def random_crop(images: torch.Tensor, padding: int) -> torch.Tensor:
    """Pad each image by ``padding`` pixels (reflect) and crop it back at a random offset."""
    if padding == 0:
        return images
    batch, channels, height, width = images.shape
    padded = reflect_pad(images, padding).contiguous()  # (B, C, H+2p, W+2p)
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
    flip = torch.rand(images.shape[0], device=images.device) < probability
    # torch.where, not images[flip]: a boolean-mask index makes the host wait for the device every step.
    return torch.where(flip.view(-1, 1, 1, 1), images.flip(3), images)


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Scale uint8 or [0, 1] float images to zero mean and unit variance per channel."""
    if images.dtype == torch.uint8:
        images = images.float().div_(255)
    return (images - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std in [0, 1] of uint8 images (N, C, H, W), in chunks (memmaps welcome)."""
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for start in range(0, len(images), chunk):
        block = torch.as_tensor(images[start : start + chunk]).double().div_(255)
        total += block.sum(dim=(0, 2, 3))
        squares += block.square().sum(dim=(0, 2, 3))
    count = images.shape[0] * images.shape[2] * images.shape[3]
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(1e-12).sqrt()
    return mean.float(), std.float().clamp_min(1e-6)
