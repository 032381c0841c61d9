"""Any network from YAML (a class or builder: ``torchvision.models.resnet18``) gets the data's ``num_classes`` and
``in_channels`` where its signature takes them (``num_classes`` also through ``**kwargs``, as torchvision's builders
pass it on); one whose input or output does not fit the data is refused before training, naming both."""

import collections.abc
import contextlib
import inspect
import pkgutil
import typing
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def type_hints(function: Any) -> dict[str, Any]:
    """``function``'s annotations; none where one does not resolve here (unknown: literal numbers only). Names of typing
    and collections.abc resolve where its module imports them for type checkers only (torch's ``Callable``)."""
    for names in (None, {**vars(collections.abc), **vars(typing)}):
        with contextlib.suppress(Exception):
            return typing.get_type_hints(function, localns=names)
    return {}


def parameters_of(target: Any, returned: bool = True) -> Iterator[inspect.Parameter]:
    """Each parameter of ``target``, its annotation resolved (else ``Any``), then of what its ``**kwargs`` reach: a class's
    parents, and (``returned``) the class a builder returns (resnet18: ResNet); a ``**kwargs`` last if it takes others."""
    made = target if isinstance(target, type) else returned and type_hints(target).get("return")
    chain = [] if made is target else [target]
    chain += [c.__init__ for c in made.__mro__ if "__init__" in vars(c)] if isinstance(made, type) else []
    for function in chain:
        signature = inspect.signature(function).parameters.values()
        hints = type_hints(function)
        yield from (p.replace(annotation=hints.get(p.name, Any)) for p in signature if p.kind != p.VAR_KEYWORD)
        if not (kwargs := [p for p in signature if p.kind == p.VAR_KEYWORD]):
            return
    yield kwargs[0]


def parameters(target: Any) -> tuple[dict[str, Any], bool]:
    """The type of each argument ``target`` takes (through its classes' ``**kwargs``), and whether it takes others."""
    found, more = {}, False
    for parameter in parameters_of(target, returned=False):  # a builder's **kwargs: jsonargparse's (takes)
        if not (more := parameter.kind == parameter.VAR_KEYWORD) and parameter.kind != parameter.VAR_POSITIONAL:
            found.setdefault(parameter.name, parameter.annotation)
    return found, more


def takes(target: Any, name: str) -> bool:
    with contextlib.suppress(TypeError, ValueError):
        return any(p.name == name or (name == "num_classes" and p.kind == p.VAR_KEYWORD) for p in parameters_of(target))
    return False


def network_arguments(network: Any, init_args: dict, num_classes: int, in_channels: int) -> dict:
    network = pkgutil.resolve_name(network) if isinstance(network, str) else network
    data = {"num_classes": num_classes, "in_channels": in_channels}
    return {**init_args, **{key: value for key, value in data.items() if takes(network, key)}}


@torch.no_grad()
def check_fits(net: nn.Module, input_shape: tuple[int, int, int], num_classes: int) -> None:
    """Run two blank images of the data's shape through ``net``: its output must be (2, num_classes)."""
    training = net.training
    try:
        net.eval()  # BatchNorm statistics untouched (and a train() override may not return the module)
        output = net(torch.zeros(2, *input_shape))
    except RuntimeError as error:
        advice = "Choose a network that takes in_channels, or data with the channels it expects (data.channels)"
        with contextlib.suppress(RuntimeError):  # the channels fit: the images are too small
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
    if not isinstance(output, torch.Tensor):  # a tuple (logits, features), a dict of heads
        raise ValueError(
            f"the network {type(net).__name__} gives a {type(output).__name__}, not a tensor of [2, {num_classes}] "
            "logits for 2 images: its forward returns the logits alone (keep other outputs in another method)"
        )
    if list(output.shape) != [2, num_classes]:
        raise ValueError(
            f"the network {type(net).__name__} gives outputs of shape {list(output.shape)} for 2 images, not "
            f"[2, {num_classes}] (one logit per class of the data); give it num_classes, or a head with "
            f"{num_classes} outputs"
        )
    if num_classes > 1 and output.min() >= 0 and torch.allclose(output.double().sum(dim=1), torch.ones(2).double()):
        raise ValueError(  # the classic silent bug: cross-entropy's log-softmax of probabilities flattens its gradients
            f"the network {type(net).__name__} gives probabilities (each image's outputs sum to 1), not logits: "
            "remove the softmax at the end of its forward; cross-entropy applies log-softmax itself, predict softmax"
        )


def check_given(target: Any, given: dict, data: dict, option: str) -> None:
    """Refuse a value of ``given`` (not its default) that the data decides otherwise (``data``): replaced unsaid, the run
    would not be the one asked for."""
    defaults: dict[str, Any] = {}
    with contextlib.suppress(TypeError, ValueError):  # a signature not to be read: no defaults
        for parameter in parameters_of(target):
            defaults.setdefault(parameter.name, None if parameter.default is parameter.empty else parameter.default)
    for key, value in data.items():
        said, value = (list(v) if isinstance(v, list | tuple) else v for v in (given.get(key), value))
        if said not in (None, defaults.get(key), value):
            raise ValueError(
                f"{option}.{key}={said}, but the data gives {value}: the data decides it. Leave {option}.{key} out, "
                "or change the data (its classes, channels or image size)"
            )
