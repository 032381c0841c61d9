"""Telling a network the data's class count and channels, where it takes them, and checking it fits.

A network from YAML is any ``nn.Module`` class or builder (``template.nets.ResNet18``,
``torchvision.models.resnet18``...). It gets the data's ``num_classes`` and ``in_channels`` where its signature
takes them (``num_classes`` also through ``**kwargs``, as torchvision's builders pass it on); one whose input or
output does not fit the data is an error before training that names both.
"""

import contextlib
import inspect
import pkgutil
import typing
from typing import Any

import torch
from torch import nn


def takes(target: Any, name: str) -> bool:
    """Whether the network class or function ``target`` takes the argument ``name``."""
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return name in parameters or (name == "num_classes" and passes_on)


def network_arguments(class_path: str, init_args: dict, num_classes: int, in_channels: int) -> dict:
    """``init_args`` with the data's class count and channels where the network takes them, over the config's."""
    target = pkgutil.resolve_name(class_path)
    data = {"num_classes": num_classes, "in_channels": in_channels}
    return {**init_args, **{key: value for key, value in data.items() if takes(target, key)}}


def check_fits(net: nn.Module, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """Run two blank images of the data's shape through ``net``: its output must be (2, num_classes)."""
    training = net.training
    try:
        net.eval()  # BatchNorm statistics untouched (and a train() override may not return the module)
        with torch.no_grad():
            output = net(torch.zeros(2, *input_shape))
    except RuntimeError as error:
        advice = "Choose a network that takes in_channels, or data with the channels it expects (data.channels)"
        with torch.no_grad(), contextlib.suppress(RuntimeError):  # the channels fit: the images are too small
            net(torch.zeros(1, input_shape[0], 224, 224))
            advice = (
                f"It takes larger images of these channels: {input_shape[1]}x{input_shape[2]} pixels are pooled away "
                "before its head. Use larger images (data.image_size) or a network that downsamples less"
            )
        raise ValueError(
            f"the network {type(net).__name__} does not take the data's inputs (channels, height, width) "
            f"{list(input_shape)}: {str(error).splitlines()[0]}. {advice}"
        ) from None
    finally:
        net.train(training)
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != (2, num_classes):
        shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise ValueError(
            f"the network {type(net).__name__} gives outputs of shape {shape} for 2 images, not [2, {num_classes}] "
            f"(one logit per class of the data); give it num_classes, or a head with {num_classes} outputs"
        )


def check_given(target: Any, given: dict, data: dict, option: str) -> None:
    """Refuse a value of ``given`` other than its default that contradicts the one the data decides (``data``): it
    would be replaced without a word, and the run would not be the one asked for."""
    defaults, made = {}, target
    if not isinstance(target, type):  # a builder's **kwargs reach the class it returns (resnet18: ResNet)
        with contextlib.suppress(Exception):
            made = typing.get_type_hints(target).get("return")
    inits = [c.__init__ for c in made.__mro__] if isinstance(made, type) else []
    for function in [target, *inits]:
        with contextlib.suppress(TypeError, ValueError):
            for parameter in inspect.signature(function).parameters.values():
                defaults.setdefault(parameter.name, None if parameter.default is parameter.empty else parameter.default)
    for key, value in data.items():
        said, value = (list(v) if isinstance(v, list | tuple) else v for v in (given.get(key), value))
        if said not in (None, defaults.get(key), value):
            raise ValueError(
                f"{option}.{key}={said}, but the data gives {value}: the data decides it. Leave {option}.{key} out, "
                "or change the data (its classes, channels or image size)"
            )
