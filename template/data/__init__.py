"""Image sources as LightningDataModules."""

from template.data.base import ImageDataModule, stratified_split
from template.data.cifar10 import CIFAR10DataModule
from template.data.digits import DigitsDataModule

__all__ = ["CIFAR10DataModule", "DigitsDataModule", "ImageDataModule", "stratified_split"]
