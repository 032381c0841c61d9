"""Exact resume and pre-emption: random-number state in the checkpoint; SIGTERM saves and stops."""

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torchmetrics import Metric

from template.checkpoints import restoring
from template.compat import accumulating, at_last_batch, kill_launched

RNG_KEY, METRICS_KEY = "rng_states", "training_metrics"
# A SIGTERM this soon after the first is the same one delivered twice: timeout(1) signals the process and then
# its group, and Lightning forwards rank 0's to the ranks it launched.
REPEAT_AFTER_S = 2.0
# How long a SIGTERM waits for the validation under way to finish: SLURM's KillWait and Kubernetes' grace period
# default to 30 s, and the checkpoint is written after it.
VALIDATION_GRACE_S = 15.0


def training_metrics(module: L.LightningModule) -> list[tuple[str, Metric]]:
    """The module's metrics an epoch of training gathers (``train_acc``): those of tensor states (not lists)."""
    found = [(name, m) for name, m in module.named_modules() if isinstance(m, Metric) and name.startswith("train")]
    return [(name, m) for name, m in found if all(isinstance(v, torch.Tensor) for v in m.metric_state.values())]


class Trainer(L.Trainer):
    """Lightning's Trainer, which stops for a SIGTERM only where the optimizer has stepped (in a validation within the
    epoch too): the gradients of a group half accumulated are in no checkpoint (a resume would step on the rest alone);
    and not within a fit's validation, which a resume would skip (that score lost to the best checkpoint), unless it
    runs on ``VALIDATION_GRACE_S`` after the signal: a scheduler kills a while after its SIGTERM."""

    sigterm_seen: float | None = None  # when a SIGTERM was first read, within a batch of its arrival

    @property
    def received_sigterm(self) -> bool:
        if not super().received_sigterm:
            return False
        self.sigterm_seen = self.sigterm_seen or time.monotonic()
        validating = self.validating and time.monotonic() - self.sigterm_seen < VALIDATION_GRACE_S
        return not (self.state.fn == TrainerFn.FITTING and (validating or accumulating(self)))


class ResumeState(Callback):
    """Exact resume: every checkpoint holds the random-number states (augmentation, dropout) and the epoch's
    training metrics so far (torchmetrics named ``train...``: train/acc covers the whole epoch), restored at
    ``on_train_start``.

    On SIGTERM, Lightning raises ``SIGTERMException`` after the running step on every rank (after a fit's running
    validation); this writes
    ``preempted_filename`` beside the other checkpoints and the CLI exits with 143, saying how to resume (SLURM's
    SIGUSR1 requeues: scripts/slurm.sbatch). A SIGTERM outside the batches (where Lightning never reads its flag: an
    epoch-end hook, a checkpoint being written, a deadlocked collective), or a second one, ends the process at once
    (143, its ranks killed).
    """

    def __init__(self, preempted_filename: str = "preempted.ckpt") -> None:
        self.preempted_filename = preempted_filename
        self._pending: dict[str, Any] | None = None
        self._metrics: Any = None  # a checkpoint's training metrics of the epoch it stopped in
        self._in_batches = False  # Lightning reads its SIGTERM flag after the running batch
        self._first_sigterm: float | None = None
        self._watch: tuple[threading.Thread, int, int, int] | None = None  # thread, pipe ends, previous fd

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Python, NumPy, torch (and CUDA) generator states, as tensors and primitives (weights_only-safe).
        name, keys, position, has_gauss, cached = np.random.get_state()
        checkpoint[RNG_KEY] = states = {
            "python": random.getstate(),
            "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states["cuda"] = torch.cuda.get_rng_state_all()
        checkpoint[METRICS_KEY] = metrics = {"epoch": trainer.current_epoch}
        for name, metric in training_metrics(pl_module):
            with metric.sync_context():  # every rank's images (each rank saves; rank 0's file is kept)
                metrics[name] = {key: value.clone() for key, value in metric.metric_state.items()}

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._pending, self._metrics = checkpoint.get(RNG_KEY), checkpoint.get(METRICS_KEY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        metrics, self._metrics = self._metrics, None
        if isinstance(metrics, dict) and metrics.get("epoch") == trainer.current_epoch and trainer.is_global_zero:
            with restoring(trainer.ckpt_path, f"its {METRICS_KEY}"):  # resumed within the epoch: on with its images
                for name, metric in training_metrics(pl_module):  # on rank 0 alone: the ranks' sum is the whole
                    for key, value in metric.metric_state.items() if name in metrics else ():  # one added since
                        saved = metrics[name].get(key)
                        fits = isinstance(saved, torch.Tensor) and saved.shape == value.shape and saved.isfinite().all()
                        if not fits:
                            raise ValueError(f"{name}.{key} is no finite tensor of shape {tuple(value.shape)}")
                        setattr(metric, key, saved.to(value.device, value.dtype))
        if (states := self._pending) is None:
            return
        self._pending = None
        with restoring(trainer.ckpt_path, f"its {RNG_KEY}"):
            python = states["python"]
            random.setstate((python[0], tuple(python[1]), python[2]))
            name, keys, position, has_gauss, cached = states["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
            torch.set_rng_state(states["torch"])
            if "cuda" in states and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(states["cuda"])

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_watching()
        self._in_batches, self._first_sigterm = False, None
        if threading.current_thread() is not threading.main_thread():
            return  # set_wakeup_fd is for the main thread only
        # Python's handlers run between bytecodes, never in a blocked C++ collective; the C-level handler writes
        # each signal's number to the wakeup fd at once, for a thread to read.
        read, write = os.pipe()
        os.set_blocking(write, False)  # a signal handler must never block on a full pipe
        previous = signal.set_wakeup_fd(write)
        thread = threading.Thread(target=self._watch_signals, args=(trainer, read), name="sigterm", daemon=True)
        thread.start()
        self._watch = (thread, read, write, previous)

    def _watch_signals(self, trainer: L.Trainer, read: int) -> None:
        while True:
            for signum in os.read(read, 64):
                if signum == 0:  # _stop_watching's
                    return
                if signum == signal.SIGTERM:
                    self._on_sigterm(trainer)

    def _on_sigterm(self, trainer: L.Trainer) -> None:
        now = time.monotonic()
        if self._first_sigterm is None:
            self._first_sigterm = now
            if self._in_batches:
                return  # Lightning stops after this batch, and on_exception saves preempted.ckpt
        elif now - self._first_sigterm < REPEAT_AFTER_S:
            return
        os.write(2, b"SIGTERM outside a batch, or a second one: exiting at once, without a checkpoint\n")
        kill_launched(trainer, signal.SIGKILL)
        os._exit(128 + signal.SIGTERM)

    def _stop_watching(self) -> None:
        if self._watch is None:
            return
        thread, read, write, previous = self._watch
        signal.set_wakeup_fd(previous)
        os.write(write, b"\0")
        thread.join()
        for fd in (read, write):
            os.close(fd)
        self._watch = None

    # Lightning reads its flag after every batch but a loop's last: the hooks after that one can block.
    def on_train_batch_start(self, *_) -> None:
        self._in_batches = True

    on_validation_batch_start = on_train_batch_start

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int):
        self._in_batches = not at_last_batch(trainer, validating=False)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0):
        self._in_batches = not at_last_batch(trainer, validating=True)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop_watching()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        try:
            if isinstance(exception, SIGTERMException) and trainer.checkpoint_callback is not None:
                directory = getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
                path = Path(directory) / self.preempted_filename
                trainer.save_checkpoint(path)
                if trainer.is_global_zero:
                    sys.stderr.write(f"Stopped by SIGTERM after global step {trainer.global_step}; wrote {path}. ")
                    sys.stderr.write(f"Resume with the same options and --ckpt_path {path}\n")
        finally:
            self._stop_watching()  # only now: a second SIGTERM while it saves still ends the process
