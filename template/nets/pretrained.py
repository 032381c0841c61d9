"""Pretrained torchvision weights, offline: found in the torch hub cache or named as missing, and a new head.

``--model.net torchvision.models.resnet18 --model.net.weights DEFAULT`` builds the network with the
data's class count and no weights, then ``template.checkpoints.load_pretrained`` reads the weights'
file from the torch hub cache (checked against the hash in its name, tensors only: never torch hub's
own loader, which unpickles) into everything but the head. Nothing is downloaded while training: a
weights file that is not in the cache is an error naming the file and the folder to put it in. A
``weights_file`` is read in place of the cache, with the same head rule.
"""

import math
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from template.checkpoints import check_hub_file


def weights_of(init_args: dict) -> Any:
    """The torchvision weights enum value a network's arguments ask for, or None."""
    weights = init_args.get("weights")
    return weights if isinstance(weights, Enum) and hasattr(weights, "url") else None


def pretrained(class_path: str, net_args: Any, data_args: Any, weights_file: str | None, wanted: bool) -> str | None:
    """The file the network starts from, if any, with the network and data arguments (a jsonargparse
    Namespace each) set for it: torchvision weights named in ``net_args`` are read from the hub cache (or from
    ``weights_file``), never by torch hub's loader, the network built without them; a timm network
    (``template.nets.timm_net``) reads its own, ``weights_file`` as its ``pretrained_file``. The data takes the
    weights' normalisation, input size and evaluation resize unless given. ``wanted``: False when a checkpoint
    holds the weights."""
    timm = class_path.rpartition(".")[2] == "timm_net"
    weights = None if timm else weights_of(vars(net_args))
    if "weights" in net_args:
        net_args.weights = None  # built without them: loaded by template.checkpoints.load_pretrained
    if weights_file and wanted and not Path(weights_file).is_file():  # before any data is read
        raise FileNotFoundError(
            f"weights_file {weights_file}: no such file (in {Path(weights_file).resolve().parent}); give the path "
            "of a state_dict saved with torch.save or safetensors, or leave weights_file out"
        )
    # The data as the weights were trained, whether they are read now or are in a checkpoint already.
    if timm and net_args.get("pretrained"):
        from template.nets.timm_models import pretrained_config

        config = pretrained_config(net_args.name)
        size = config.input_size[1] if config.input_size[1] == config.input_size[2] else list(config.input_size[1:])
        trained = {"mean": list(config.mean), "std": list(config.std), "image_size": size, "crop": config.crop_pct}
        if config.interpolation in ("bilinear", "bicubic"):
            trained["interpolation"] = config.interpolation
        follow(data_args, trained, f"timm {net_args.name}")
    elif weights is not None:
        transform = weights.transforms()
        size = transform.crop_size[0] if len(transform.crop_size) == 1 else list(transform.crop_size)
        crop = min(transform.crop_size) / transform.resize_size[0]
        trained = {"mean": list(transform.mean), "std": list(transform.std), "image_size": size, "crop": crop}
        trained["interpolation"] = transform.interpolation.value
        follow(data_args, trained, f"{type(weights).__name__}.{weights.name}")
    if timm:  # timm_net reads its weights itself, weights_file as its pretrained_file
        net_args.pretrained = bool(wanted and (net_args.get("pretrained") or weights_file))
        net_args.pretrained_file = weights_file if wanted else None
        return None
    if not wanted or weights is None:
        return weights_file if wanted else None
    return weights_file or check_cached(weights)


def follow(data_args: Any, trained: dict, source: str) -> None:
    """Set the data's options to how pretrained weights were trained (mean, std, image_size; resize_size from the
    crop fraction) where the user gave none; a one-line note names the ones they gave that differ."""
    crop = trained.pop("crop")
    if data_args.get("channels") == "grayscale":  # grey images: timm sums the first convolution over the colours
        trained["mean"], trained["std"] = [sum(trained["mean"]) / 3], [sum(trained["std"]) / 3]
    differ = []
    for key, value in trained.items():
        if key not in data_args:
            continue
        if data_args[key] is None:
            data_args[key] = value
        elif pair(data_args[key]) != pair(value):
            differ.append(f"data.{key}={data_args[key]} (trained: {value})")
    if "resize_size" in data_args and data_args.resize_size is None and data_args.get("image_size") is not None:
        data_args.resize_size = math.floor(min(pair(data_args.image_size)) / crop)  # its evaluation crop's framing
    if differ:
        rank_zero_info(f"note: {'; '.join(differ)}: not what {source} was trained with")


def pair(value: Any) -> Any:
    if isinstance(value, str):
        return value
    return [value, value] if isinstance(value, int) else [float(v) for v in value]


def cached_file(weights: Any) -> Path:
    """Where torch hub keeps ``weights`` (``$TORCH_HOME/hub/checkpoints/<file>``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name


def check_cached(weights: Any) -> Path:
    """The torch hub cache's file of ``weights``, refused if it is missing: nothing is downloaded during a run."""
    path = cached_file(weights)
    if not path.is_file():
        raise FileNotFoundError(
            f"pretrained weights {type(weights).__name__}.{weights.name} are not in the torch hub cache: put "
            f"{path.name} (from {weights.url}) in {path.parent}, or point TORCH_HOME at a folder whose "
            "hub/checkpoints holds it; nothing is downloaded during a run"
        )
    return check_hub_file(path, weights.url)


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
