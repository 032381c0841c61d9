"""The doctor's short fits of a copy of the configured module (never the user's): memorise a few images, measure a
step's memory and time. Each runs the module's own ``training_step`` and ``configure_optimizers`` under a Trainer
of its own, with the configured device, precision and gradient clipping."""

import copy
import itertools
import logging
import time
import warnings

import lightning as L
import torch


def short_fit(model: L.LightningModule, trainer: L.Trainer, batch: tuple, steps: int, callback: L.Callback):
    """Fit a copy of ``model`` on ``batch`` repeated ``steps`` times, writing nothing; returns ``callback``."""
    device = trainer.strategy.root_device
    # Not a list of the batch: a list would be read as one loader per item.
    batches = itertools.repeat(tuple(tensor.to(device) for tensor in batch), steps)
    logger = logging.getLogger("lightning.pytorch")  # quiet: the configured Trainer gave its setup notes once
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="You defined a `validation_step` but have no `val_dataloader`")
            quick = L.Trainer(
                accelerator=device.type,
                devices=[device.index] if device.type == "cuda" and device.index is not None else 1,
                precision=trainer.precision,
                gradient_clip_val=trainer.gradient_clip_val,
                gradient_clip_algorithm=trainer.gradient_clip_algorithm,
                max_steps=steps,  # also the length the module's scheduler plans for (estimated_stepping_batches)
                limit_val_batches=0,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                callbacks=[callback],
            )
            quick.fit(copy.deepcopy(model), train_dataloaders=batches)
    finally:
        logger.setLevel(level)
    return callback


class Memorise(L.Callback):
    """Records the module's loss at each step, and stops once the batch is learnt: every image classified
    right (by the training step's own logits) and the loss down to half its first value or less (a loss
    with label smoothing has a floor above 0: no fixed target)."""

    def __init__(self, labels: torch.Tensor) -> None:
        self.labels, self.losses, self.logits, self.memorised = labels.cpu(), [], None, False

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.net.register_forward_hook(lambda net, inputs, logits: setattr(self, "logits", logits.detach()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.losses.append(float(outputs["loss"]))  # what training_step returned
        correct = self.logits is not None and torch.equal(self.logits.argmax(1).cpu(), self.labels)
        if correct and self.losses[-1] <= self.losses[0] / 2:
            self.memorised = trainer.should_stop = True


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


class MeasureSteps(L.Callback):
    """Memory after the first step (layer outputs, parameters, gradients, optimizer state), then the time
    of the steps after a second, warm-up one, for ``seconds`` and at least two steps."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.memory, self.timed_steps, self.elapsed = seconds, {}, 0, 0.0
        self.activations, self.hooks, self.start = [], [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            self.hooks = [module.register_forward_hook(lambda m, i, out: self.activations.append(tensor_bytes([out])))
                          for module in pl_module.net.modules() if not list(module.children())]  # fmt: skip

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        if batch_idx == 0:
            for hook in self.hooks:
                hook.remove()
            parameters = list(pl_module.parameters())  # their gradients stay until the next step zeroes them
            self.memory = {
                "parameters": tensor_bytes(parameters),
                "gradients": tensor_bytes(p.grad for p in parameters),
                "optimizer": tensor_bytes(t for o in trainer.optimizers for s in o.state.values() for t in s.values()),
                "activations": sum(self.activations),
            }
        elif batch_idx == 1:  # the warm-up step: allocator and kernel choice
            self.start = time.perf_counter()
        else:
            self.timed_steps, self.elapsed = batch_idx - 1, time.perf_counter() - self.start
            if self.elapsed >= self.seconds and self.timed_steps >= 2:
                trainer.should_stop = True
