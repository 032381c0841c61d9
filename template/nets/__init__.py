"""Networks: plain ``nn.Module``s that know nothing of Lightning."""

from template.nets.resnet import (
    BasicBlock,
    ResNet,
    ResNet9,
    ResNet18,
    ResNet34,
    ResNetSmall,
)

__all__ = ["BasicBlock", "ResNet", "ResNet9", "ResNet18", "ResNet34", "ResNetSmall"]
