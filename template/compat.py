"""The few Lightning and torch internals this project leans on, in one place.

Each is an attribute or function outside the public API, so an upgrade may change it without a
word: ``tests/test_compat.py`` calls every one against the installed versions, and fails loudly
when one has moved, and a test greps the package so that no other module reaches for one.
"""

from typing import Any

import lightning as L
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from torch import nn


def logged_params(params: Any) -> dict[str, Any]:
    """Hyper-parameters flattened to the keys Lightning's loggers send (``model/net/class_path``...)."""
    return _flatten_dict(_convert_params(params))


def at_last_batch(trainer: L.Trainer, validating: bool) -> bool:
    """Whether the batch the loop just ran was its last (training's, or validation's within fit)."""
    loop = trainer.fit_loop.epoch_loop
    return (loop.val_loop if validating else loop).batch_progress.is_last_batch


def kill_launched(trainer: L.Trainer, signal: int) -> None:
    """Signal the processes Lightning's launcher started (DDP ranks), as it does on a second Ctrl-C."""
    if trainer.strategy.launcher is not None:
        trainer.strategy.launcher.kill(signal)


def is_compiled(net: nn.Module) -> bool:
    """Whether ``nn.Module.compile`` already compiled ``net`` in place."""
    return getattr(net, "_compiled_call_impl", None) is not None
