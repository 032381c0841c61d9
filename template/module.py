"""The training recipe as a LightningModule: loss, metrics, parameter groups, optimizer and schedule."""

import warnings
from collections.abc import Callable, Iterable
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import grad_norm
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from template.compat import is_compiled
from template.data_init import init_from_data
from template.evaluation import fed, multi_crop_logits
from template.restore import load_module, register
from template.schedule import (
    Factory,
    WarmupCosine,
    build_optimizer,
    build_scheduler,
    interval_of,
    parameter_groups,
    run_length,
)
from template.text import check_class_names

__all__ = ["ClassificationModule", "WarmupCosine", "parameter_groups"]  # WarmupCosine: older configs name it here
# Injected by LightningCLI from YAML (`class_path` + `init_args`): any torch optimizer and scheduler.
OptimizerCallable = Callable[[Iterable], Optimizer]
SchedulerCallable = Callable[[Optimizer], LRScheduler | ReduceLROnPlateau]


class ClassificationModule(L.LightningModule):
    """Trains any image classifier ``net`` that maps (B, C, H, W) images to (B, K) logits.

    Args:
        net: the network; swapped from YAML with ``model.net.class_path``.
        num_classes, class_names, input_shape: K, a name per class (kept for ``predict``) and (C, H, W) of one
            input; linked from the DataModule by the CLI.
        optimizer, lr_scheduler: any torch optimizer and scheduler (``None``: a constant LR); one that takes
            ``total_steps`` gets the run's length in the unit it steps at (``template.schedule.run_length``).
        scheduler_interval: ``step`` or ``epoch``; by default the unit its own arguments count (``interval_of``).
        scheduler_monitor: the metric ReduceLROnPlateau watches (each validation).
        label_smoothing: of the training loss' targets (val/ and test/loss are plain cross-entropy).
        channels_last: NHWC weights and inputs, which tensor-core convolutions (fp16/bf16) run faster.
        compile: ``torch.compile`` the network in place (``nn.Module.compile``: checkpoint keys unchanged).
        flip_tta, tta_translate: evaluate on the mean logits of each image, its mirror and crops shifted by
            that many pixels (``template.evaluation``).
        layer_decay: layer-wise learning-rate decay for fine-tuning (``template.schedule.parameter_groups``).
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        class_names: list[str] | None = None,
        input_shape: tuple[int, int, int] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: SchedulerCallable | None = WarmupCosine,
        scheduler_interval: Literal["step", "epoch"] | None = None,
        scheduler_monitor: str = "val/loss",
        label_smoothing: float = 0.0,
        channels_last: bool = False,
        compile: bool = False,
        flip_tta: bool = False,
        tta_translate: int = 0,
        layer_decay: float | None = None,
    ) -> None:
        super().__init__()
        check_class_names(class_names or [], num_classes)  # as a checkpoint's are: refused now, not when read back
        # Registry names and plain values, for template.restore; objects passed from Python would need pickle.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Attribute '.*' is an instance of `nn.Module`")
            self.save_hyperparameters()
        for key in ("net", "optimizer", "lr_scheduler"):
            if not isinstance(self.hparams.get(key), dict | str | None):
                del self.hparams[key]
        self.net = net
        self.optimizer, self.lr_scheduler = Factory(optimizer), Factory(lr_scheduler) if lr_scheduler else None
        self.scheduler_interval, self.scheduler_monitor = scheduler_interval, scheduler_monitor
        self.label_smoothing, self.layer_decay = label_smoothing, layer_decay
        self.channels_last, self.compile_net = channels_last, compile
        self.flip_tta, self.tta_translate = flip_tta, tta_translate
        self.class_names = list(class_names) if class_names else [str(index) for index in range(num_classes)]
        if input_shape is not None:
            self.example_input_array = torch.zeros(2, *input_shape)
        # One metric object per split: their states must never mix.
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        # "disable": a NaN loss shows as NaN (the default drops it with a warning), and no check syncs.
        self.val_loss, self.test_loss = MeanMetric(nan_strategy="disable"), MeanMetric(nan_strategy="disable")
        self.val_images, self.test_images = SumMetric(), SumMetric()  # how many were evaluated, over all ranks
        self.images_evaluated: dict[str, int] = {}

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=True, **kwargs):
        """The module of a checkpoint read as data by ``template.restore``, not by Lightning's loader, which would
        parse whatever its file names. Arguments given override the checkpoint's (``net=`` a network, say)."""
        if hparams_file is not None:
            raise TypeError("hparams_file is not read: a checkpoint's own record says what it is (template.restore)")
        return load_module(cls, checkpoint_path, map_location, strict, **kwargs)

    def setup(self, stage: str) -> None:
        if self.channels_last:  # moving to the device later keeps the memory format
            self.net.to(memory_format=torch.channels_last)
        if self.compile_net and not is_compiled(self.net):
            self.net.compile()

    def on_fit_start(self) -> None:
        init_from_data(self)  # layers computed from the training images (a whitening stem), on rank 0, broadcast

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)  # (B, C, H, W), NHWC in memory
        return self.net(images)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # On logits: cross_entropy applies log-softmax itself (a softmax first is the classic silent bug).
        # Labels are class indices (B,) or MixUp/CutMix's probabilities (B, K).
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = self._loss(logits, labels)
        if labels.ndim == 2:  # MixUp/CutMix's class probabilities (B, K): scored against the larger share
            labels = labels.argmax(dim=1)
        self.train_acc.update(logits.detach(), labels)  # computed once an epoch, over all its batches
        self.log("train/loss", loss)
        return loss

    def on_train_epoch_end(self) -> None:
        if fed(self.trainer, self.train_acc):  # not by a training_step of a subclass's own
            self.log("train/acc", self.train_acc)  # Lightning computes it, synced across DDP ranks, and resets it

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        # Before clipping: spikes and collapses show a learning rate too high or low. Only at logged steps (a sync).
        if (self.trainer.global_step + 1) % self.trainer.log_every_n_steps == 0:
            if norms := grad_norm(self.net, norm_type=2):  # none without gradients
                self.log("train/grad_norm", norms["grad_2.0_norm_total"])

    def _evaluate(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> torch.Tensor:
        images, labels = batch
        logits = multi_crop_logits(self, images, self.flip_tta, self.tta_translate)  # the mirror's and shifts' votes
        getattr(self, f"{split}_acc").update(logits, labels)
        # The batch's mean loss once per image: a last, smaller batch weighs less (MeanMetric's weight= drops NaN).
        # Plain cross-entropy, no label smoothing: runs that smooth differently (a sweep's) compare on one scale.
        getattr(self, f"{split}_loss").update(F.cross_entropy(logits, labels).expand(len(labels)))
        getattr(self, f"{split}_images").update(len(labels))
        return logits

    def _log_evaluation(self, split: str) -> None:
        # Computed over the whole split, across DDP ranks (every rank checkpoints on the same value), and reset.
        for name, metric in (("loss", getattr(self, f"{split}_loss")), ("acc", getattr(self, f"{split}_acc"))):
            if fed(self.trainer, metric):
                self.log(f"{split}/{name}", metric, prog_bar=name == "acc")
        counter = getattr(self, f"{split}_images")
        if not self.trainer.sanity_checking:  # its few batches: not what a score of the run covered
            self.images_evaluated[split] = int(counter.compute())
        counter.reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._evaluate(batch, "val")  # the logits, for callbacks (confusion matrix, misclassified)

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return multi_crop_logits(self, batch[0], self.flip_tta, self.tta_translate).softmax(dim=1)  # (B, K)

    def configure_optimizers(self) -> dict:
        steps = lambda: run_length(self.trainer, "step")  # noqa: E731  (asked only by what plans the run)
        groups = parameter_groups(self, self.layer_decay)  # its own parameters too, should a subclass add some
        optimizer = build_optimizer(self.optimizer, self.hparams.get("optimizer"), groups, steps, self.net.buffers())
        if self.lr_scheduler is None:
            return {"optimizer": optimizer}
        length = lambda: run_length(self.trainer, self.scheduler_interval or "step")  # noqa: E731  (in its unit)
        scheduler = build_scheduler(self.lr_scheduler, self.hparams.get("lr_scheduler"), optimizer, length)
        settings = {"scheduler": scheduler, "interval": self.scheduler_interval or interval_of(scheduler), "name": "lr"}
        if isinstance(scheduler, ReduceLROnPlateau):  # stepped by epoch, at each validation: where its metric is new
            measured = settings["interval"] == "epoch" and self.scheduler_monitor.startswith("val")
            every = self.trainer.check_val_every_n_epoch if measured else None
            settings |= {"monitor": self.scheduler_monitor, "frequency": every or 1}
        return {"optimizer": optimizer, "lr_scheduler": settings}


register(ClassificationModule)
