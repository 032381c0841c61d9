"""Rich's progress bar, updated no more often than it is drawn."""

import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

REDRAW_RATE = 20  # how often Rich's thread looks for an update to draw, a second


class ThrottledProgressBar(RichProgressBar):
    """``RichProgressBar`` that takes in a batch's progress and metrics (an ``.item()`` each, most of the framework's
    cost on small steps) at most ``refresh_rate`` times a second, and always an epoch's first and last batches.
    No ``v_num``: the run summary names the run."""

    def __init__(self, refresh_rate: int = 2, leave: bool = False) -> None:
        # Rich's redraw thread sleeps 1/rate between looks, and stopping the bar waits for it.
        super().__init__(refresh_rate=REDRAW_RATE if refresh_rate > 0 else 0, leave=leave)
        self.updates_per_second = refresh_rate
        self._last_update = float("-inf")  # the first batch is always shown

    def _due(self, batch_idx: int, total: Callable[[], float | int | None]) -> bool:
        if self.is_disabled:  # every DDP rank but 0: nothing to draw, and no current dataloader to count
            return False
        now = time.monotonic()
        if batch_idx and now - self._last_update < 1 / max(self.updates_per_second, 1) and batch_idx + 1 != total():
            return False
        self._last_update = now
        return True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int):
        if self._due(batch_idx, lambda: self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0):
        if self._due(batch_idx, lambda: self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The stock bar reads the metrics here: one synced across DDP ranks (train/acc) would all_gather on rank 0
        # alone, a deadlock. The next update shows them.
        self.refresh()
