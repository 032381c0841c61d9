"""Layers of airbench's network (Jordan, 2024, arXiv 2404.00498), each usable in any network."""

import torch
from torch import nn


class WhiteningConv(nn.Conv2d):
    """A frozen ``kernel_size`` convolution without padding whose filters whiten the image's patches: the
    eigenvectors of the training patches' covariance, each divided by the square root of its eigenvalue plus
    ``eps`` (which bounds the gain of pixel noise), and their negatives, so a GELU after it loses nothing.
    Decorrelated, equally scaled inputs make a large learning rate work from the first step.

    ``template.data_init`` calls ``fit`` at the start of training with ``fit_images`` random training images,
    unless the filters are ``fitted`` already (a checkpoint's or a resumed run's stay).
    """

    def __init__(self, in_channels: int = 3, kernel_size: int = 2, eps: float = 5e-4, fit_images: int = 5000) -> None:
        super().__init__(in_channels, 2 * in_channels * kernel_size**2, kernel_size, padding=0, bias=True)
        self.eps, self.fit_images = eps, fit_images
        self.weight.requires_grad_(False)  # computed, not learned; the bias learns
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def fit(self, images: torch.Tensor) -> None:
        """The filters from normalised images (N, C, H, W), in float64, in chunks."""
        side = self.kernel_size[0]
        dims = self.in_channels * side * side
        total, outer, count = torch.zeros(dims, dtype=torch.float64), torch.zeros(dims, dims, dtype=torch.float64), 0
        for chunk in images.split(256):
            patches = chunk.double().cpu().unfold(2, side, 1).unfold(3, side, 1)  # (B, C, H', W', k, k)
            patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, dims)  # (B * H' * W', C * k * k)
            total += patches.sum(0)
            outer += patches.T @ patches
            count += len(patches)
        mean = total / count
        covariance = outer / count - torch.outer(mean, mean)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending; columns are the eigenvectors
        filters = (eigenvectors.T / (eigenvalues.clamp_min(0) + self.eps).sqrt()[:, None]).flip(0)  # largest first
        filters = filters.reshape(dims, self.in_channels, side, side)
        self.weight.copy_(torch.cat([filters, -filters]).to(self.weight.dtype))
        self.fitted.fill_(True)


@torch.no_grad()
def identity_init_(conv: nn.Conv2d) -> nn.Conv2d:
    """Make the first ``in_channels`` filters of ``conv`` pass their input through (``nn.init.dirac_``): a deep
    plain network starts as a shallower one, which trains in fewer steps (Zagoruyko & Komodakis, 2017)."""
    nn.init.dirac_(conv.weight[: min(conv.out_channels, conv.in_channels)])
    return conv


class FrozenWeightBatchNorm(nn.BatchNorm2d):
    """BatchNorm2d whose scale stays 1 and whose shift learns ``bias_lr_scale`` times faster than the other
    parameters (``template.schedule.parameter_groups`` reads ``lr_scales``). Before a GELU that the next
    convolution rescales anyway, a learned scale adds nothing but a direction to drift in. ``momentum`` is
    torch's convention (the new batch's weight): airbench's 0.6 is 0.4 here.
    """

    def __init__(
        self, num_features: int, momentum: float = 0.4, eps: float = 1e-12, bias_lr_scale: float = 64.0
    ) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.weight.requires_grad_(False)
        self.lr_scales = {"bias": bias_lr_scale}
