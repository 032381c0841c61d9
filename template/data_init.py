"""Layers initialised from the training data when a fit starts (a whitening stem, or any layer with ``fit(images)``,
``fitted`` and ``fit_images``): rank 0 computes them and broadcasts, so every DDP replica starts the same."""

import lightning as L
import torch

from template.data.augment import center_crop, normalize


def training_images(datamodule: L.LightningDataModule, count: int) -> torch.Tensor:
    """``count`` training images (N, C, H, W) as the network sees them unaugmented, drawn with seed 0: at random,
    since a folder lists its classes one after another (a whitening fitted to aeroplanes' skies)."""
    dataset = datamodule.datasets["train"]
    chosen = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:count].sort().values
    images, _ = dataset.__getitems__(chosen.tolist())  # uint8 (N, C, H', W'), any source
    images = center_crop(images, datamodule.image_size)
    return normalize(images, datamodule.mean, datamodule.std)


def init_from_data(module: L.LightningModule) -> None:
    """Fit every layer of ``module.net`` that initialises from data and has not yet (a restored checkpoint's has)."""
    layers = [m for m in module.net.modules() if callable(getattr(m, "fit", None)) and not getattr(m, "fitted", True)]
    if not layers:
        return
    trainer = module.trainer
    states = None
    if trainer.is_global_zero:
        if "train" not in getattr(trainer.datamodule, "datasets", {}):  # no DataModule, or not an ImageDataModule
            raise ValueError(
                f"{type(layers[0]).__name__} computes its weights from the training images of an ImageDataModule "
                "(template.data); this fit has none: train with one, or load weights that were fitted already"
            )
        images = training_images(trainer.datamodule, max(layer.fit_images for layer in layers))
        for layer in layers:
            layer.fit(images[: layer.fit_images])
        states = [{key: value.cpu() for key, value in layer.state_dict().items()} for layer in layers]
    states = trainer.strategy.broadcast(states, src=0)
    for layer, state in zip(layers, states):
        layer.load_state_dict(state)
