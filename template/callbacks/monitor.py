"""What a run looks like while it trains: speed, curves side by side, errors as pictures, a CSV."""

import csv
import io
import re
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from torchmetrics.classification import MulticlassConfusionMatrix
from torchvision.utils import make_grid

from template.callbacks.run_record import run_directory
from template.files import write_atomic
from template.module import ClassificationModule
from template.options import check_logged, check_modes
from template.schedule import check_plan

METRIC_NAME = re.compile(r"^[A-Za-z_][\w/.\-]*$")
MAX_ROWS, MAX_NAMES = 100_000, 1_000  # metrics.csv rows (one an epoch) and columns a resumed run takes
IN_PROGRESS = ("epoch", "lr", "seconds", "images", "loss")  # a checkpoint's figures of the epoch it stopped in


def heatmap(matrix: torch.Tensor, cell: int = 16) -> torch.Tensor:
    """A confusion matrix as a (3, K*cell, K*cell) image: rows true classes, columns predictions, each row
    normalised, dark blue (0) to yellow (1). Tensor ops, not a plotting library: far faster."""
    share = matrix.float() / matrix.sum(dim=1, keepdim=True).clamp_min(1)  # (K, K) in [0, 1]
    low, high = torch.tensor([0.1, 0.1, 0.4]), torch.tensor([1.0, 0.9, 0.1])
    image = low[:, None, None] + (high - low)[:, None, None] * share[None]  # (3, K, K)
    return image.repeat_interleave(cell, dim=1).repeat_interleave(cell, dim=2)


class TrainingMonitor(Callback):
    """Images/s and epoch time, train and val loss on one chart, a confusion matrix and the misclassified
    validation images in TensorBoard, and the epoch metrics in ``metrics.csv``. Nothing is synchronised per step
    (Lightning's ThroughputMonitor syncs the GPU at every step, and never writes metrics.csv).

    Args:
        misclassified: how many misclassified validation images to show (0: none).
        csv_name: the epoch-metrics file in the run directory.
    """

    def __init__(self, misclassified: int = 16, csv_name: str = "metrics.csv") -> None:
        self.misclassified = misclassified
        self.csv_name = csv_name
        self._epoch_start = self._train_end = 0.0
        self._images, self._loss = 0, 0.0  # the epoch's images and their summed training loss
        self._confusion: MulticlassConfusionMatrix | None = None
        self._wrong: list[tuple[torch.Tensor, int, int]] = []
        self.rows: list[dict] = []
        self._before: dict = {}
        self._epoch, self._lr = -1, float("nan")  # the epoch in progress and the learning rate it started with
        self._carried: dict | None = None  # a checkpoint's epoch in progress, which a resume within it goes on with
        self._pending: tuple[L.Trainer, dict, dict] | None = None  # the epoch's row, until its metrics are in
        self.validated_step: int | None = None  # the global step of this process's last validation in a fit

    def state_dict(self) -> dict:  # a resumed run's metrics.csv keeps the epochs before it
        self._write_row()
        seconds = self._train_end - self._epoch_start  # to its last training batch: a resume redoes those after
        figures = (self._epoch, self._lr, seconds, self._images, float(self._loss))
        return {"rows": self.rows, "in_progress": dict(zip(IN_PROGRESS, figures))}

    def load_state_dict(self, state_dict: dict) -> None:
        rows = state_dict.get("rows")  # untrusted: numbers under metric names only, never a spreadsheet formula
        # and no more than a run writes: metrics.csv is rows times names cells, written again at every checkpoint
        if not (isinstance(rows, list) and len(rows) <= MAX_ROWS and all(isinstance(row, dict) for row in rows)):
            return
        if len(set().union(*rows)) <= MAX_NAMES and all(
            all(isinstance(k, str) and METRIC_NAME.match(k) and isinstance(v, int | float) for k, v in row.items())
            for row in rows
        ):
            self.rows = rows
        part = state_dict.get("in_progress")  # numbers only (loss: not in a checkpoint of an earlier version)
        part = {"loss": 0.0, **part} if isinstance(part, dict) else {}
        if all(type(part.get(key)) in (int, float) for key in IN_PROGRESS):
            self._carried = part

    @staticmethod
    def _tensorboard(trainer: L.Trainer):
        return next((lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_modes(trainer)  # the callbacks' and schedulers' monitors, kept the right way round
        writer = self._tensorboard(trainer)
        if writer is not None and trainer.is_global_zero:
            layout = {"loss": {"train and val": ["Multiline", ["train/loss", "val/loss"]]}}
            writer.add_custom_scalars(layout)  # one chart: overfitting shows as the two curves parting

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_logged(trainer, recipe=type(pl_module) is ClassificationModule)  # the watched metrics, before training

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_plan(trainer)  # here, not in configure_optimizers: a resume's restored plan, not the doctor's short fits
        # A fit resumed within an epoch (pre-empted, stopped at max_steps) starts no epoch: it goes on with the
        # checkpoint's figures of it (time, images, starting learning rate), not from 0 (uptime as its epoch time).
        self._start_epoch(trainer)
        carried, self._carried = self._carried, None
        if carried is not None and carried["epoch"] == trainer.current_epoch:
            self._lr, self._images, self._loss = carried["lr"], carried["images"], carried["loss"]
            self._epoch_start -= carried["seconds"]

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_row()
        self._start_epoch(trainer)

    def _start_epoch(self, trainer: L.Trainer) -> None:
        self._epoch_start = self._train_end = time.perf_counter()
        self._epoch, self._images, self._loss = trainer.current_epoch, 0, 0.0
        # callback_metrics keeps a value until it is logged again (train/grad_norm at some steps, val/ when
        # validation skips an epoch); each value logged anew is a new tensor, so the same objects are old.
        self._before = dict(trainer.callback_metrics)
        # The largest group's rate: the head's, where layer decay or a frozen backbone's scale lowers the others (the
        # first group is then the stem's); a schedule that collapsed shows.
        groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
        self._lr = float(max((group["lr"] for group in groups), default=float("nan")))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._images += len(batch[1])
        if isinstance(loss := outputs.get("loss") if isinstance(outputs, dict) else None, torch.Tensor):
            # Lightning hands on the loss divided by the accumulated batches; summed on the device, read once an epoch.
            self._loss = self._loss + loss.detach() * trainer.accumulate_grad_batches * len(batch[1])
        self._train_end = time.perf_counter()  # the last one: the end of training, before validation

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        training = max(self._train_end - self._epoch_start, 1e-9)  # without validation
        seconds = time.perf_counter() - self._epoch_start
        speed = {"train/epoch_time": seconds, "train/images_per_sec": self._images * trainer.world_size / training}
        pl_module.log_dict(speed)
        # The epoch's mean training loss over every rank's images (train/loss is logged per step: its last one).
        summed = [
            torch.as_tensor(value, dtype=torch.float32, device=pl_module.device) for value in (self._loss, self._images)
        ]
        loss, images = (float(trainer.strategy.reduce(value, reduce_op="sum")) for value in summed)
        speed = {**speed, **({"train/loss": round(loss / images, 6)} if images else {})}
        # The module's on_train_epoch_end, after this, may log epoch metrics (train/acc): the row waits for the
        # next hook of ours (a checkpoint's state, the next epoch, the end of training).
        self._pending = (trainer, {"epoch": trainer.current_epoch, "step": trainer.global_step, "lr": self._lr}, speed)

    def _write_row(self) -> None:
        if self._pending is None:
            return
        (trainer, row, speed), self._pending = self._pending, None
        # Every rank reads: reading computes the epoch's metrics, and those synced across DDP ranks sync then.
        metrics = trainer.callback_metrics
        if not trainer.is_global_zero or not trainer.loggers or (run_dir := run_directory(trainer)) is None:
            return
        metrics = {k: round(float(v), 6) for k, v in metrics.items() if v.numel() == 1 and v is not self._before.get(k)}
        if self.rows and self.rows[-1].get("epoch") == row["epoch"]:  # a stop within the epoch wrote its first part
            row = self.rows.pop() | row
        self.rows.append({**row, **metrics, **speed})
        fields = list(dict.fromkeys(key for row in self.rows for key in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fields)
        writer.writeheader()
        writer.writerows(self.rows)
        write_atomic(Path(run_dir) / self.csv_name, text.getvalue())  # replaced, never written through another name

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_row()

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        num_classes = pl_module.hparams.get("num_classes", 10)
        self._confusion = MulticlassConfusionMatrix(num_classes).to(pl_module.device)
        self._wrong = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0):
        if not isinstance(outputs, torch.Tensor):
            return
        images, labels = batch
        predictions = outputs.argmax(dim=1)
        self._confusion.update(predictions, labels)
        if len(self._wrong) < self.misclassified:
            for index in (predictions != labels).nonzero().flatten()[: self.misclassified - len(self._wrong)].tolist():
                self._wrong.append((images[index].detach().cpu(), int(labels[index]), int(predictions[index])))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self._confusion is None:
            return
        self.validated_step = trainer.global_step
        matrix = self._confusion.compute()  # synchronised across ranks by torchmetrics
        writer = self._tensorboard(trainer)
        if writer is None or not trainer.is_global_zero:
            return
        names = getattr(pl_module, "class_names", None) or [str(k) for k in range(len(matrix))]
        step = trainer.global_step
        writer.add_image("val/confusion_matrix", heatmap(matrix.cpu()), global_step=step)
        rows = [f"{names[i]}: {' '.join(map(str, row))}" for i, row in enumerate(matrix.tolist())]
        writer.add_text("val/confusion_matrix", "  \n".join(["rows true, columns predicted", *rows]), step)
        if not self._wrong:
            return
        images = torch.stack([image for image, _, _ in self._wrong]).float()
        data = trainer.datamodule
        if getattr(data, "mean", None) is not None and len(data.mean) == images.shape[1]:
            images = images * data.std.view(1, -1, 1, 1) + data.mean.view(1, -1, 1, 1)  # undo normalisation
        grid = make_grid(images.clamp(0, 1), nrow=8, padding=1, pad_value=1.0)
        writer.add_image("val/misclassified", grid, global_step=step)
        shown = ", ".join(f"{names[t]}->{names[p]}" for _, t, p in self._wrong)
        writer.add_text("val/misclassified", f"true->predicted, left to right: {shown}", step)
