"""Stops (or skips) a training step whose loss or gradient norm is NaN or infinite."""

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.optim import Optimizer

from template.module import writes_step_metrics


class NonFiniteError(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


class NonFiniteGuard(Callback):
    """Checks the loss and the gradient norm before every optimizer step, and logs the norm.

    A NaN spreads into every weight at the next step and never leaves; caught before the
    step, the last checkpoints stay good. The check costs one device sync a step. With
    ``16-mixed`` the gradient scaler already skips steps with overflowing gradients, so
    only the loss is checked then.

    Args:
        skip: skip such steps (their gradients are dropped) and count them in
            ``train/skipped_steps`` instead of stopping.
    """

    def __init__(self, skip: bool = False) -> None:
        self.skip = skip
        self.skipped = 0
        self._loss: torch.Tensor | None = None
        self._batch_idx = -1
        self._buffers: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._batch_idx = batch_idx
        if self.skip:
            # The forward pass has updated BatchNorm's running statistics by the time the loss
            # is known; a skipped step must put them back too. Buffers are small.
            self._buffers = [buffer.detach().clone() for buffer in pl_module.buffers()]

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        loss = self._loss if self._loss is not None else torch.zeros((), device=pl_module.device)
        scaled = getattr(trainer.precision_plugin, "scaler", None) is not None
        grad_norm = torch.zeros((), device=loss.device)
        if grads and not scaled:
            grad_norm = torch.nn.utils.get_total_norm(grads)  # fused (foreach) norms: one call, not one a tensor
            if writes_step_metrics(trainer):  # computed every step anyway; logged at the logging interval
                pl_module.log("train/grad_norm", grad_norm, on_step=True, on_epoch=False)
        finite = torch.isfinite(loss).all() & torch.isfinite(grad_norm)
        # Gradients are already averaged across DDP ranks, but the loss is each rank's own:
        # all ranks must agree, or one stops while the others wait for it forever.
        if trainer.strategy.reduce_boolean_decision(bool(finite), all=True):
            return
        what = [name for name, value in (("loss", loss), ("gradient norm", grad_norm)) if not torch.isfinite(value)]
        where = f"global step {trainer.global_step}, epoch {trainer.current_epoch}, batch index {self._batch_idx}"
        values = f"loss={loss.item():.4g}, gradient norm={grad_norm.item():.4g}"
        if self.skip:
            self.skipped += 1
            optimizer.zero_grad(set_to_none=True)  # parameters without a gradient are not updated
            with torch.no_grad():
                for buffer, saved in zip(pl_module.buffers(), self._buffers):
                    buffer.copy_(saved)
            pl_module.log("train/skipped_steps", float(self.skipped), on_step=False, on_epoch=True, reduce_fx="max")
            return
        detail = ", ".join(what) if what else "the value on another rank"
        raise NonFiniteError(
            f"non-finite {detail} at {where} ({values}); training stopped before this step touched the "
            "weights, so the last checkpoint is good. Lower the learning rate, clip gradients, check the "
            "inputs for NaN (template doctor), or set nonfinite.skip: true to skip such steps."
        )
