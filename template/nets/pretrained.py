"""Pretrained torchvision weights, offline: found in the torch hub cache or named as missing, and a new head.

``--model.net torchvision.models.resnet18 --model.net.weights DEFAULT`` builds the network with the
data's class count and no weights, then ``template.checkpoints.load_pretrained`` reads the weights'
file from the torch hub cache (checked against the hash in its name, tensors only: never torch hub's
own loader, which unpickles) into everything but the head. Nothing is downloaded while training: a
weights file that is not in the cache is an error naming the file and the folder to put it in. A
``weights_file`` is read in place of the cache, with the same head rule.
"""

import hashlib
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch import nn


def weights_of(init_args: dict) -> Any:
    """The torchvision weights enum value a network's arguments ask for, or None."""
    weights = init_args.get("weights")
    return weights if isinstance(weights, Enum) and hasattr(weights, "url") else None


def pretrained(net_args: Any, data_args: Any, weights_file: str | None, wanted: bool) -> str | Path | None:
    """The file the network starts from, if any, with the network and data arguments (a jsonargparse
    Namespace each) set for it: torchvision weights named in ``net_args`` are read from the hub cache (or from
    ``weights_file``), never by torch hub's loader, the network built without them; the data takes their
    normalisation and input size unless given. ``wanted``: False when a checkpoint holds the weights."""
    weights = weights_of(vars(net_args)) if wanted else None
    if "weights" in net_args:
        net_args.weights = None  # built without them: loaded by template.checkpoints.load_pretrained
    if not wanted:
        return None
    if weights_file and not Path(weights_file).is_file():  # before any data is read
        raise FileNotFoundError(
            f"weights_file {weights_file}: no such file (in {Path(weights_file).resolve().parent}); give the path "
            "of a state_dict saved with torch.save or safetensors, or leave weights_file out"
        )
    if weights is not None:
        weights_file = weights_file or check_cached(weights)
        stats = weights.transforms()  # how the weights were trained: their normalisation and input size
        if "mean" in data_args and data_args.mean is None and data_args.get("std") is None:
            data_args.mean, data_args.std = list(stats.mean), list(stats.std)
        if "image_size" in data_args and data_args.image_size is None:
            data_args.image_size = stats.crop_size[0] if len(stats.crop_size) == 1 else list(stats.crop_size)
    return weights_file


def cached_file(weights: Any) -> Path:
    """Where torch hub keeps ``weights`` (``$TORCH_HOME/hub/checkpoints/<file>``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def check_cached(weights: Any) -> Path:
    """The torch hub cache's file of ``weights``, refused if it is missing (nothing is downloaded during a
    run) or if its contents do not match the hash prefix in its name (torchvision's convention,
    ``resnet18-f37072fd.pth``). It is then read as tensors only (``template.checkpoints.read_weights``)."""
    path = cached_file(weights)
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained weights {type(weights).__name__}.{weights.name} are not in the torch hub cache: put "
            f"{path.name} (from {weights.url}) in {path.parent}, or point TORCH_HOME at a folder whose "
            "hub/checkpoints holds it; nothing is downloaded during a run"
        )
    expected = torch.hub.HASH_REGEX.search(path.name)
    if expected is not None:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        if not digest.hexdigest().startswith(expected.group(1)):
            raise ValueError(
                f"refusing {path}: its contents do not match the hash {expected.group(1)} in its name (damaged, or "
                f"not torchvision's file); replace it with {weights.url}"
            )
    return path


def replace_head(net: nn.Module, num_classes: int) -> nn.Linear | None:
    """Put a fresh ``nn.Linear`` with ``num_classes`` outputs in place of the network's last linear
    layer (its classifier: ``fc``, ``classifier[-1]``, ``heads.head``...) when its outputs differ.
    Returns the new head, or None if the old one already fits."""
    name = head_name(net)
    head = net.get_submodule(name)
    if head.out_features == num_classes:
        return None
    new = nn.Linear(head.in_features, num_classes, bias=head.bias is not None)
    nn.init.xavier_uniform_(new.weight)  # as the template's own heads
    if new.bias is not None:
        nn.init.zeros_(new.bias)
    parent = net.get_submodule(name.rpartition(".")[0]) if "." in name else net
    setattr(parent, name.rpartition(".")[2], new)
    return new


def head_name(net: nn.Module) -> str:
    """The name of the network's classifier: its last ``nn.Linear`` (``fc``, ``classifier.1``...)."""
    name = next((n for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear)), None)
    if name is None:
        raise ValueError(
            f"{type(net).__name__} has no nn.Linear classifier to replace: a pretrained network needs one as its head"
        )
    return name


def head_and_backbone(net: nn.Module) -> tuple[list[nn.Parameter], list[nn.Module]]:
    """The last linear layer's parameters, and every other top-level child (the backbone)."""
    head = net.get_submodule(head_name(net))
    backbone = [module for module in net.children() if module is not head and head not in list(module.modules())]
    return list(head.parameters()), backbone
