"""Networks: plain ``nn.Module``s that know nothing of Lightning."""

from template.nets.airbench import AirbenchNet
from template.nets.resnet import BasicBlock, ResNet, ResNet9, ResNet18, ResNet34, ResNetSmall
from template.nets.timm_models import timm_net

__all__ = ["AirbenchNet", "BasicBlock", "ResNet", "ResNet9", "ResNet18", "ResNet34", "ResNetSmall", "timm_net"]
