"""Stops (or skips) a training step whose loss or gradient norm is NaN or infinite."""

import math

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.optim import Optimizer


class NonFiniteError(RuntimeError):
    """The loss or the gradients became NaN or infinite."""


# In 16-true, optimizer states and settings are float16 too: Adam's eps of 1e-8 is 0 there, and a step divides by it.
HALF = " In 16-true precision, Adam's default eps (1e-8) is 0 in float16: use 16-mixed or bf16, or eps 1e-4 or more."


def outputs_problem(name: str, loss: float) -> str | None:
    """What a non-finite evaluation loss ``name`` says of the network (None: it is finite): its accuracy then counts
    NaN logits' argmax as answers."""
    if math.isfinite(loss):
        return None
    split = name.split("/")[0]
    return (
        f"{name} is {loss}: the network's outputs are NaN or infinite for some images, so {split}/acc scores no "
        "answer of its. Its weights give them (a BatchNorm running_var below 0, values past the precision's range): "
        "check the checkpoint or weights file it started from, or evaluate in 32-bit (--trainer.precision 32-true)"
    )


def stop(where: tuple[int, int, int] | None, loss: float, grad_norm: float, how: str, hint: str = "") -> None:
    """Raise NonFiniteError naming the step (global step, epoch, batch index; None: another rank's)."""
    what, place = "loss or gradient norm", "on another rank"
    if where is not None:
        bad = [name for name, value in (("loss", loss), ("gradient norm", grad_norm)) if not math.isfinite(value)]
        what = ", ".join(bad) or "the value on another rank"
        place = f"at global step {where[0]}, epoch {where[1]}, batch index {where[2]} "
        place += f"(loss={loss:.4g}, gradient norm={grad_norm:.4g})"
    raise NonFiniteError(
        f"non-finite {what} {place}; {how}, so the checkpoints written before it are good. Lower the learning "
        "rate, clip gradients, check the inputs for NaN (template doctor), or set nonfinite.skip: true to skip them."
        + hint
    )


class NonFiniteGuard(Callback):
    """Checks the loss and the gradient norm before every optimizer step of any LightningModule (one device sync): a
    NaN caught before it spreads into the weights leaves the last checkpoints good. With ``16-mixed`` only the loss
    is checked: the gradient scaler already skips overflowing steps.

    Args:
        skip: skip such steps (their gradients dropped), counted in ``train/skipped_steps``, instead of stopping.
        check_every_n_steps: look only every this many steps and before every validation and checkpoint (GPU runs
            whose small steps a sync would stall): bad steps may reach the weights in memory, never a checkpoint.
            ``skip`` needs 1.
    """

    def __init__(self, skip: bool = False, check_every_n_steps: int = 1) -> None:
        if check_every_n_steps < 1 or (skip and check_every_n_steps != 1):
            raise ValueError(
                f"check_every_n_steps={check_every_n_steps}: must be at least 1, and 1 with skip "
                "(skipping a step needs its verdict before the step)"
            )
        self.skip = skip
        self.check_every_n_steps = check_every_n_steps
        self.skipped = 0
        self._values: torch.Tensor | None = None  # (n, 2): loss and gradient norm of the unchecked steps
        self._where: list[tuple[int, int, int]] = []  # their global step, epoch and batch index
        self._loss: torch.Tensor | None = None
        self._batch_idx = -1
        self._buffers: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._batch_idx = batch_idx
        if self.skip:  # the forward pass updates BatchNorm's running statistics: a skipped step puts them back
            self._buffers = [buffer.detach().clone() for buffer in pl_module.buffers()]

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Optimizer) -> None:
        loss = self._loss if self._loss is not None else torch.zeros((), device=pl_module.device)
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if getattr(trainer.precision_plugin, "scaler", None) is not None or not grads:
            grad_norm = torch.zeros((), device=loss.device)
        else:
            grad_norm = torch.nn.utils.get_total_norm(grads)
        where = (trainer.global_step, trainer.current_epoch, self._batch_idx)
        if self.check_every_n_steps > 1:  # record on the device now, look later: no sync here
            if self._values is None or self._values.device != loss.device:
                self._values = torch.empty(self.check_every_n_steps, 2, device=loss.device)
            self._values[len(self._where)] = torch.stack([loss.float().mean(), grad_norm.float()])
            self._where.append(where)
            if len(self._where) == self.check_every_n_steps:
                self.check_pending(trainer)
            return
        # Scalars read back: no kernel launched to compare them; on a GPU the first syncs, the second is free.
        finite = math.isfinite(loss.item()) and math.isfinite(grad_norm.item())
        # The loss is each rank's own: all ranks must agree, or one stops while the others wait for it forever.
        if trainer.strategy.reduce_boolean_decision(finite, all=True):
            return
        if not self.skip:
            hint = HALF if trainer.precision == "16-true" else ""
            stop(
                where,
                loss.float().mean().item(),
                grad_norm.item(),
                "training stopped before it touched the weights",
                hint,
            )
        self.skipped += 1
        optimizer.zero_grad(set_to_none=True)  # parameters without a gradient are not updated
        with torch.no_grad():
            for buffer, saved in zip(pl_module.buffers(), self._buffers):
                buffer.copy_(saved)
        pl_module.log("train/skipped_steps", float(self.skipped), on_step=False, on_epoch=True, reduce_fx="max")

    def check_pending(self, trainer: L.Trainer, *_) -> None:
        """Look at the steps recorded since the last look; stop naming the first non-finite one."""
        if not self._where:
            return
        values, where = self._values[: len(self._where)], self._where
        self._where = []
        finite = torch.isfinite(values).all(dim=1)
        if trainer.strategy.reduce_boolean_decision(bool(finite.all()), all=True):
            return
        how = f"found by the check every {self.check_every_n_steps} steps: the weights in memory are no longer "
        how += "finite, but no checkpoint was written after that step"
        bad = [index for index, ok in enumerate(finite.tolist()) if not ok]
        if not bad:  # the non-finite step was on another rank
            stop(None, 0.0, 0.0, how)
        stop(where[bad[0]], *values[bad[0]].tolist(), how)

    # Before anything reads or saves the weights.
    on_validation_start = on_train_epoch_end = on_save_checkpoint = on_train_end = check_pending

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A fit's validation of NaN outputs stops it before a checkpoint keeps its score (a test's is refused)."""
        for name, value in trainer.callback_metrics.items():
            if name.startswith("val") and "loss" in name and (problem := outputs_problem(name, float(value))):
                raise NonFiniteError(f"at epoch {trainer.current_epoch}, {problem}")
