"""Pretrained torchvision weights, offline: from the torch hub cache (or ``weights_file``), or named as missing.
``--model.net.weights DEFAULT`` builds the network with the data's class count and no weights, and
``template.checkpoints.load_pretrained`` reads the file as tensors only (torch hub's own loader unpickles) into
everything but the head. Nothing is downloaded while training.
"""

import math
import pkgutil
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from template.checkpoints import check_hub_file, recipe_checkpoint
from template.nets.timm_models import pretrained_config, timm_net


def pretrained(
    class_path: str, net_args: Any, data_args: Any, weights_file: str | None, wanted: bool, evaluating: str | None
) -> str | None:
    """The file the network starts from, if any, with the network and data arguments (jsonargparse Namespaces) set
    for it (``timm_net`` reads its own, ``weights_file`` as its ``pretrained_file``); the data takes the weights'
    normalisation, input size and evaluation resize unless given. ``wanted``: False when a checkpoint holds the
    weights; ``evaluating``: the command, where it scores the weights of no checkpoint (none would be random)."""
    timm = pkgutil.resolve_name(class_path) is timm_net
    weights = net_args.get("weights")
    weights = weights if not timm and isinstance(weights, Enum) and hasattr(weights, "url") else None
    if "weights" in net_args:
        net_args.weights = None  # built without them: loaded by template.checkpoints.load_pretrained
    if weights_file and wanted and not Path(weights_file).is_file():  # before any data is read
        raise FileNotFoundError(
            f"weights_file {weights_file}: no such file (in {Path(weights_file).resolve().parent}); give the path "
            "of a state_dict saved with torch.save or safetensors, or leave weights_file out"
        )
    if evaluating and not (weights_file or net_args.get("pretrained") or weights):
        raise ValueError(
            f"{evaluating} with no --ckpt_path would score a network of random weights: give --ckpt_path best (the "
            "latest run's best; or last, or a .ckpt file), or the weights as --weights_file FILE"
        )
    if evaluating and weights_file and recipe_checkpoint(weights_file):
        raise ValueError(
            f"--weights_file {weights_file} is a checkpoint of this template's: {evaluating} it as --ckpt_path "
            f"{weights_file}, which holds the data to the classes (in their order), preprocessing and splits it was "
            "trained with; a weights file's are not known"
        )
    # The data as the weights were trained, whether they are read now or are in a checkpoint already.
    if timm and net_args.get("pretrained"):
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
    if timm:
        net_args.pretrained = bool(wanted and (net_args.get("pretrained") or weights_file))
        net_args.pretrained_file = weights_file if wanted else None
        return None
    if not wanted or weights_file or weights is None:
        return weights_file if wanted else None
    if not (path := hub_file(weights.url)).is_file():
        raise FileNotFoundError(
            f"pretrained weights {type(weights).__name__}.{weights.name} are not in the torch hub cache: put "
            f"{path.name} (from {weights.url}) in {path.parent}, or point TORCH_HOME at a folder whose "
            "hub/checkpoints holds it; nothing is downloaded during a run"
        )
    return check_hub_file(path, weights.url)


def check_trained_head(net: nn.Module, new_head: str | None, command: str) -> None:
    """Refuse to score a classifier that no weights gave (``new_head``, or timm's for another class count than its
    weights'): new, of the data's class count, it answers at random."""
    config = getattr(net, "pretrained_cfg", None)  # a timm network's: what its weights were (template.nets.timm_net)
    if not new_head and isinstance(config, dict) and config.get("num_classes") != getattr(net, "num_classes", None):
        new_head = f"timm's weights hold a classifier for {config.get('num_classes')} classes"
    if new_head:
        raise ValueError(
            f"{command} would score a new, untrained classifier ({new_head}): weights for this data's classes have "
            "a classifier of their own, such as a fit's checkpoint (--ckpt_path) or its export"
        )


def hub_file(url: str) -> Path:
    """Where torch hub keeps ``url``'s file (``$TORCH_HOME/hub/checkpoints/<file>``)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / Path(url).name


def follow(data_args: Any, trained: dict, source: str) -> None:
    """Set the data's options the user left unset to how the weights were trained (``resize_size`` from the crop
    fraction); a one-line note names the ones they gave that differ."""
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


def head_name(net: nn.Module) -> str:
    """The name of the network's classifier: its last ``nn.Linear`` (``fc``, ``classifier.1``...)."""
    name = next((n for n, m in reversed(list(net.named_modules())) if isinstance(m, nn.Linear)), None)
    if name is None:
        raise ValueError(
            f"{type(net).__name__} has no nn.Linear classifier to replace: a pretrained network needs one as its head"
        )
    return name


def backbone_of(net: nn.Module) -> list[nn.Module]:
    """Every part of ``net`` but its classifier (``head_name``): the children of each module that holds the head,
    down to it (the layers beside it in a ``Sequential`` too), and those modules' own parameters (a ViT's
    ``cls_token`` and ``pos_embed``), each held in a module of its own."""
    head = net.get_submodule(head_name(net))

    def parts(module: nn.Module) -> list[nn.Module]:
        own = nn.Module()  # not a ParameterDict: BaseFinetuning walks an iterable module as a list of modules
        for name, parameter in module.named_parameters(recurse=False):
            own.register_parameter(name, parameter)
        found = [own] if list(own.parameters()) else []
        for child in module.children():
            if child is not head:
                found += parts(child) if any(each is head for each in child.modules()) else [child]
        return found

    return parts(net)
