"""Lightning plugins the recipe adds."""

from lightning.pytorch.plugins import TorchSyncBatchNorm
from torch import nn


class SyncBatchNorm(TorchSyncBatchNorm):
    """``sync_batchnorm: true`` that keeps timm's norm-and-activation layers whole: torch's conversion turns a
    ``BatchNormAct2d`` (a BatchNorm subclass) into a plain SyncBatchNorm, its statistics kept and its
    activation silently dropped. timm's conversion where timm is installed (it converts plain BatchNorm as
    torch does), torch's elsewhere. The CLI adds it to every run that syncs BatchNorm."""

    def apply(self, model: nn.Module) -> nn.Module:
        try:
            from timm.layers import convert_sync_batchnorm
        except ImportError:
            return super().apply(model)
        return convert_sync_batchnorm(model)
