"""Lightning plugins the recipe adds."""

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch import nn


class SyncBatchNorm(TorchSyncBatchNorm):
    """``sync_batchnorm: true`` that keeps timm's ``BatchNormAct2d`` whole (torch's conversion silently drops its
    activation): timm's conversion where timm is installed, torch's elsewhere. The CLI adds it where needed."""

    def apply(self, model: nn.Module) -> nn.Module:
        try:
            from timm.layers import convert_sync_batchnorm
        except ImportError:
            return super().apply(model)
        return convert_sync_batchnorm(model)
