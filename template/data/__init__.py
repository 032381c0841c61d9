"""Image sources as LightningDataModules."""

from template.data.base import ImageDataModule, stratified_split
from template.data.cifar10 import CIFAR10DataModule
from template.data.digits import DigitsDataModule
from template.data.folder import ImageFolderDataModule

__all__ = ["CIFAR10DataModule", "DigitsDataModule", "ImageFolderDataModule", "ImageDataModule", "stratified_split"]
