"""Rich's progress bar, updated no more often than it is drawn."""

import time
from collections.abc import Callable

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

REDRAW_RATE = 20  # how often Rich's thread looks for an update to draw (Lightning's default is 100)


class ThrottledProgressBar(RichProgressBar):
    """``RichProgressBar`` that takes in a batch's progress and metrics at most ``refresh_rate``
    times a second (kept as ``updates_per_second``; Lightning's ``refresh_rate`` attribute is
    then the redraw thread's REDRAW_RATE), and the bar only changes when it takes them in.

    The stock bar reads the metrics (a ``.item()`` each) and updates its state after every
    batch: about a millisecond, which on small steps is most of the framework's cost. The first
    and last batches of an epoch are always taken in: the speed (it/s) needs two samples, and
    the bar ends full and with final values. The logger's version number (``v_num``) is left
    out: the run summary names the run directory.
    """

    def __init__(self, refresh_rate: int = 2, leave: bool = False) -> None:
        # Rich redraws from a thread that sleeps 1/rate between looks, and stopping the bar waits
        # for it: at 2 a second, every command ended up to half a second late. The thread looks
        # REDRAW_RATE times a second (and draws only after an update); updates stay at refresh_rate.
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
        # The stock bar reads the metrics here, before Lightning has computed the epoch's: that
        # read computes them, and a metric synced across DDP ranks (train/acc) then runs its
        # all_gather on rank 0 alone, the only rank with a bar, while the others go on to the
        # collectives of later hooks: a deadlock. The bar takes the epoch's values in with the
        # next update instead, once every rank has computed them.
        self.refresh()
