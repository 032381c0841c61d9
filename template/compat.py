"""The few Lightning and torch internals this project leans on, in one place: an upgrade may change them without a
word, so ``tests/test_compat.py`` calls each against the installed versions, and greps that no other module uses one."""

import re
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector
from torch import nn

from template.checkpoints import CheckpointError, check_resume, restoring


def logged_params(params: Any) -> dict[str, Any]:
    """Hyper-parameters flattened to the keys Lightning's loggers send (``model/net/class_path``...)."""
    return _flatten_dict(_convert_params(params))


def at_last_batch(trainer: L.Trainer, validating: bool) -> bool:
    """Whether the batch the loop just ran was its last (training's, or validation's within fit)."""
    loop = trainer.fit_loop.epoch_loop
    return (loop.val_loop if validating else loop).batch_progress.is_last_batch


def accumulating(trainer: L.Trainer) -> bool:
    """Whether the training batches run so far end within a group of gradient accumulation (no optimizer step yet)."""
    return trainer.fit_loop.epoch_loop._should_accumulate()


def batches_done_in_epoch(trainer: L.Trainer) -> int:
    """The batches a fit resumed within an epoch had run of it (0 at an epoch's start)."""
    loop = trainer.fit_loop.epoch_loop
    return loop.batch_progress.current.ready if loop.restarting else 0


def kill_launched(trainer: L.Trainer, signal: int) -> None:
    """Signal the processes Lightning's launcher started (DDP ranks), as it does on a second Ctrl-C."""
    if trainer.strategy.launcher is not None:
        trainer.strategy.launcher.kill(signal)


def is_compiled(net: nn.Module) -> bool:
    """Whether ``nn.Module.compile`` already compiled ``net`` in place."""
    return getattr(net, "_compiled_call_impl", None) is not None


class _NamingRestore(_CheckpointConnector):
    """Lightning's restore of a checkpoint, an error in it named as the file's; its training state first checked to be
    of the kinds this run keeps (what it would save now), before the loops, optimizers and schedules take it."""

    def _restore_modules_and_callbacks(self, checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        with restoring(checkpoint_path):
            super()._restore_modules_and_callbacks(checkpoint_path, weights_only)

    def restore_callbacks(self) -> None:
        """EarlyStopping's patience is the command's option: Lightning took the file's (a stranger's 0 stopped a run
        at its first epoch without a better score). A resume has every callback whose state the checkpoint holds."""
        saved = (self._loaded_checkpoint or {}).get("callbacks") or {}
        for callback in self.trainer.callbacks:
            state = saved.get(callback.state_key)
            if isinstance(callback, EarlyStopping) and isinstance(state, dict) and "patience" in state:
                state["patience"] = callback.patience
        # A resume without a callback that trained the run (weight averaging, FreezeBackbone) is another run: Lightning
        # warned, and went on from EMA's average as the weights, unfrozen, its config.yaml recording neither.
        kinds = {key.split("{")[0] for key in saved if isinstance(key, str)}  # ModelCheckpoint{...}: of its settings
        kinds -= {"EarlyStopping", "Timer"}  # which stop a run, never change its weights: a resume may go on without
        if (
            self.trainer.state.fn == "fit"
            and not self.rolling_back
            and (lacking := kinds - {c.state_key.split("{")[0] for c in self.trainer.callbacks})
        ):
            raise CheckpointError(
                f"refusing {self._ckpt_path} to resume: it was trained with callback(s) {', '.join(sorted(lacking))}, "
                "whose state it holds, and this fit has none: give them again as the run was given them "
                "(--trainer.callbacks+=..., or its --config files), or start a new run from its weights (--weights_file)"
            )
        super().restore_callbacks()

    rolling_back = False

    def restore(self, checkpoint_path: Any = None, weights_only: bool | None = None) -> None:
        """Only Lightning's tuners call this, back to their own checkpoint: its settings predate the rates tried."""
        self.rolling_back = True
        try:
            super().restore(checkpoint_path, weights_only)
        finally:
            self.rolling_back = False

    def restore_training_state(self) -> None:
        with restoring(self._ckpt_path):
            if self._loaded_checkpoint and not self.rolling_back:
                like = self.dump_checkpoint(weights_only=False)
                anew = {type(self.trainer.precision_plugin).__qualname__}  # another precision's state (a scaler's)
                shapes = [
                    [p.shape for group in o.param_groups for p in group["params"]] for o in self.trainer.optimizers
                ]
                check_resume(self._loaded_checkpoint, like, str(self._ckpt_path), anew, shapes)
            super().restore_training_state()


def name_restore_errors(trainer: L.Trainer) -> None:
    trainer._checkpoint_connector = _NamingRestore(trainer)


def number_past_every_version(logger: Any) -> None:
    """Lightning numbers a new run past the ``version_N`` directories, and misses a name that is no directory (a
    dangling link, a file), which it then fails to create: the run goes past every such name, never into one."""
    if isinstance(logger, TensorBoardLogger | CSVLogger) and logger._version is None:
        found = [re.fullmatch(r"version_([0-9]{1,9})", path.name) for path in Path(logger.root_dir).glob("version_*")]
        logger._version = max((int(number[1]) + 1 for number in found if number), default=0)  # links: not followed
