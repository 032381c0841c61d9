"""The training recipe as a LightningModule: loss, metrics, parameter groups, schedule."""

import math
import os
import warnings
from collections.abc import Callable, Iterable

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_info
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy

from template.checkpoints import read_checkpoint

# Injected by LightningCLI from YAML (`class_path` + `init_args`). The scheduler also gets
# the total number of optimizer steps, which only the Trainer knows.
OptimizerCallable = Callable[[Iterable], Optimizer]
SchedulerCallable = Callable[[Optimizer, int], LRScheduler]


class WarmupCosine(LRScheduler):
    """Linear warmup, then cosine decay, stepped once per optimizer step.

    Warmup avoids the large, badly aimed updates of the first steps, when BatchNorm
    statistics and Adam's moment estimates are still poor. With ``cycles > 1`` the
    cosine restarts from the peak that many times (SGDR, Loshchilov & Hutter, 2017).

    Args:
        optimizer: the wrapped optimizer; its ``lr`` is the peak learning rate.
        total_steps: optimizer steps in the whole run.
        warmup_fraction: share of ``total_steps`` spent warming up linearly.
        min_lr_ratio: floor of the cosine, as a fraction of the peak.
        cycles: number of cosine cycles after warmup (1: no restarts).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        total_steps: int,
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.0,
        cycles: int = 1,
        last_epoch: int = -1,
    ) -> None:
        if total_steps < 1:
            raise ValueError(f"total_steps must be at least 1, got {total_steps}")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if cycles < 1:
            raise ValueError(f"cycles must be at least 1, got {cycles}")
        self.total_steps = total_steps
        self.warmup_steps = round(warmup_fraction * total_steps)
        self.min_lr_ratio = min_lr_ratio
        self.cycles = cycles
        super().__init__(optimizer, last_epoch)

    def lr_factor(self, step: int) -> float:
        """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps  # never 0: the first step is not wasted
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cycle_progress = 1.0 if progress == 1.0 else (progress * self.cycles) % 1.0
        cosine = 0.5 * (1.0 + math.cos(math.pi * cycle_progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine

    def get_lr(self) -> list[float]:
        factor = self.lr_factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the position in the schedule, but keep the plan made for this run: a run resumed
        with a larger max_epochs or max_steps follows the schedule over its new total from the step
        it stands at, instead of the old total's (which has already decayed to its floor)."""
        planned = {"total_steps": self.total_steps, "warmup_steps": self.warmup_steps}
        super().load_state_dict(state_dict)
        if state_dict.get("total_steps") == planned["total_steps"]:
            return  # the same plan: an exact resume
        self.__dict__.update(planned)
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr  # the next step already uses the new plan
        rank_zero_info(
            f"learning-rate schedule re-planned from {state_dict.get('total_steps')} to {self.total_steps} "
            f"optimizer steps; continuing from step {self.last_epoch}"
        )


def log_step_metrics(trainer: L.Trainer | None, metrics: dict[str, torch.Tensor]) -> None:
    """Write ``metrics`` of this training step to the loggers, at the logging interval only.

    As Lightning's LearningRateMonitor writes the learning rate: straight to the loggers at
    the step Lightning would use, and into ``trainer.callback_metrics`` (metrics.csv, and a
    checkpoint or early stop monitoring them, see them). ``self.log`` costs about 0.35 ms a call
    on a CPU (its result collection copies metadata each time) and a flush of the event file: on
    small steps that was the largest cost of the defaults. A step metric needs none of what it
    adds: no reduction over the epoch, no sync across ranks (each rank keeps its own values and
    rank zero writes them, as ``self.log`` would do).
    """
    if trainer is None or not trainer._logger_connector.should_update_logs:  # every log_every_n_steps
        return
    values = {name: value.detach() for name, value in metrics.items()}
    trainer.callback_metrics.update(values)
    if not trainer.loggers or not trainer.is_global_zero:
        return
    scalars = {name: float(value) for name, value in values.items()}  # a device sync, at logging steps only
    for logger in trainer.loggers:
        logger.log_metrics(scalars, step=trainer.global_step)


def total_gradient_norm(optimizer: Optimizer, device: torch.device) -> torch.Tensor:
    """Total 2-norm of the gradients ``optimizer`` holds, fused (foreach); 0 when there are none."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)


class RunningAccuracy(Metric):
    """Top-1 accuracy kept as two on-device counts, summed across DDP ranks by torchmetrics.

    For the training step, which updates it on every batch: about 15 µs a batch on a CPU
    where ``MulticlassAccuracy`` (input checks, per-class statistics) takes about 45.
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        self.correct.add_((logits.argmax(dim=1) == labels).sum())  # in place: no nn.Module attribute set
        self.total.add_(labels.numel())

    def compute(self) -> torch.Tensor:
        return self.correct.float() / self.total


def parameter_groups(net: nn.Module) -> list[dict]:
    """Split parameters into a weight-decayed group and one without decay.

    Decay pulls weights towards zero to limit their scale; on BatchNorm weights and on
    biases there is no scale to limit, and decaying them only hurts (Goyal et al., 2017).
    Every parameter with fewer than 2 dimensions is a norm weight or a bias.
    """
    decay, no_decay = [], []
    for parameter in net.parameters():
        if parameter.requires_grad:
            (decay if parameter.ndim >= 2 else no_decay).append(parameter)
    return [
        {"params": decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]


class ClassificationModule(L.LightningModule):
    """Trains any image classifier ``net`` that maps (B, C, H, W) images to (B, K) logits.

    Args:
        net: the network; swapped from YAML with ``model.net.class_path``.
        num_classes: number of classes K. Linked from the DataModule by the CLI.
        class_names: a name per class, kept in the checkpoint for ``predict``. Linked
            from the DataModule by the CLI.
        input_shape: (C, H, W) of one input, for the model summary. Linked from the
            DataModule by the CLI.
        optimizer: builds the optimizer from the parameter groups.
        lr_scheduler: builds the scheduler from the optimizer and the total number of
            optimizer steps; ``None`` keeps the learning rate constant.
        label_smoothing: mass moved from the true class to all classes in the loss.
        channels_last: keep weights and inputs in NHWC memory order, which tensor-core
            convolutions (fp16/bf16 on recent GPUs) run faster; results are the same.
        compile: ``torch.compile`` the network in place (``nn.Module.compile``, so checkpoint
            keys do not change): faster steps on GPU after a compile of tens of seconds.
        flip_tta: evaluate (val, test, predict) on the average of the logits of each image
            and its mirror image. Only for classes that a mirror does not change.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        input_shape: tuple[int, int, int] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: SchedulerCallable | None = WarmupCosine,
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        compile: bool = False,
        flip_tta: bool = False,
    ) -> None:
        super().__init__()
        if class_names is not None and len(class_names) != num_classes:
            raise ValueError(f"{len(class_names)} class_names given for num_classes={num_classes}")
        # Under LightningCLI this records the parsed config (class paths and plain values),
        # so `template test --ckpt_path X` rebuilds the same network and the checkpoint
        # loads with torch.load(weights_only=True). Objects passed from Python are not
        # config and are dropped: they would need pickle to load.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Attribute '.*' is an instance of `nn.Module`")
            self.save_hyperparameters()
        for key in ("net", "optimizer", "lr_scheduler"):
            if not isinstance(self.hparams.get(key), dict | str | None):
                del self.hparams[key]
        self.net = net
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.label_smoothing = label_smoothing
        self.channels_last = channels_last
        self.compile_net = compile
        self.flip_tta = flip_tta
        self.class_names = list(class_names) if class_names else [str(index) for index in range(num_classes)]
        if input_shape is not None:
            self.example_input_array = torch.zeros(2, *input_shape)
        # One metric object per split: their states must never mix.
        self.train_acc = RunningAccuracy()
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self._train_acc_logged = False  # in this epoch: train/acc is logged once an epoch
        # This batch's loss ("loss"), and gradient norms by optimizer (id): see gradient_norm.
        self._this_step: dict[str | int, torch.Tensor] = {}

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args, **kwargs):
        """Lightning's ``load_from_checkpoint``, after the checks of an untrusted file: no pickled
        objects, no class path it may not name, tensors that match their digest
        (``template.checkpoints.read_checkpoint``)."""
        if not isinstance(checkpoint_path, str | os.PathLike) or "://" in str(checkpoint_path):
            raise TypeError(f"{cls.__name__}.load_from_checkpoint takes the path of a local file here")
        read_checkpoint(checkpoint_path, cls)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def __setattr__(self, name: str, value) -> None:
        if name == "_current_fx_name":
            # Lightning sets this before and after every hook it calls, ~40 times a training step;
            # nn.Module's checks for parameters, buffers and submodules (~1 µs) are moot for a string.
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def setup(self, stage: str) -> None:
        if self.channels_last:  # moving to the device later keeps the memory format
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net and not getattr(self.net, "_compiled_call_impl", None):
            self.net.compile()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)  # (B, C, H, W), NHWC in memory
        return self.net(images)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # cross_entropy applies log-softmax itself: a softmax before it would squash the
        # gradients and is the classic silent bug.
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = self._loss(logits, labels)
        self.train_acc.update(logits.detach(), labels)  # update only: no per-batch accuracy to compute
        self._this_step["loss"] = loss.detach()  # logged before the optimizer step
        if not self._train_acc_logged:
            # Logging the metric object once an epoch is enough: Lightning computes and resets it
            # at the epoch's end, and every batch has updated it.
            self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, batch_size=len(labels))
            self._train_acc_logged = True
        return loss

    def on_train_epoch_start(self) -> None:
        self._train_acc_logged = False

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self._this_step.clear()

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        # Once an optimizer step, after gradient accumulation: the last batch's loss, as self.log
        # would, and the gradient norm when the NaN guard (which runs first) has computed it.
        if (loss := self._this_step.get("loss")) is None:
            return
        metrics = {"train/loss": loss}
        if (norm := self._this_step.get(id(optimizer))) is not None:
            metrics["train/grad_norm"] = norm
        log_step_metrics(self._trainer, metrics)

    def _evaluate_logits(self, images: torch.Tensor) -> torch.Tensor:
        logits = self(images)
        if self.flip_tta:
            logits = (logits + self(images.flip(-1))) / 2  # the mirror image's vote, averaged in
        return logits

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> torch.Tensor:
        images, labels = batch
        logits = self._evaluate_logits(images)
        metric = self.val_acc if split == "val" else self.test_acc
        metric(logits, labels)
        # sync_dist: average over DDP ranks so every rank sees (and checkpoints on) the same value.
        self.log(f"{split}/loss", self._loss(logits, labels), batch_size=len(labels), sync_dist=True)
        self.log(f"{split}/acc", metric, batch_size=len(labels), prog_bar=True)
        return logits

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "val")  # the logits, for callbacks (confusion matrix, misclassified)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images = batch[0]
        return self._evaluate_logits(images).softmax(dim=1)  # (B, K) class probabilities

    def gradient_norm(self, optimizer: Optimizer) -> torch.Tensor:
        """Total 2-norm of the gradients ``optimizer`` is about to apply, before clipping.

        Computed once a step (a few hundred µs for a ResNet on a CPU) and shared: the NaN guard
        checks it in ``on_before_optimizer_step``, this module logs it with the loss right after,
        and clipping by norm reuses it, as ``clip_grad_norm_`` would have computed it again.
        """
        norm = self._this_step.get(id(optimizer))
        if norm is None:
            norm = self._this_step[id(optimizer)] = total_gradient_norm(optimizer, self.device)
        return norm

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        norm = self._this_step.get(id(optimizer))  # computed this step (by the NaN guard), or None
        precision = self.trainer.precision_plugin
        plain = type(precision).clip_grad_by_norm is Precision.clip_grad_by_norm
        by_norm = gradient_clip_algorithm is None or gradient_clip_algorithm == GradClipAlgorithmType.NORM
        if norm is None or not gradient_clip_val or not by_norm or not plain:  # FSDP and others clip their own way
            return super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        # The parameters Lightning's own clip_grad_by_norm would clip, with the norm already known.
        torch.nn.utils.clip_grads_with_norm_(precision.main_params(optimizer), gradient_clip_val, norm)

    def configure_optimizers(self) -> dict:
        optimizer = self.optimizer(parameter_groups(self.net))
        if self.lr_scheduler is None:
            return {"optimizer": optimizer}
        scheduler = self.lr_scheduler(optimizer, int(self.trainer.estimated_stepping_batches))
        # interval "step": warmup and cosine are defined per optimizer step, not per epoch.
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "name": "lr"}}
