"""Exact resume and pre-emption: random-number state in the checkpoint; SIGTERM saves and stops."""

import random
import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

RNG_KEY = "rng_states"


def collect_rng_states() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states, as tensors and primitives (weights_only-safe)."""
    name, keys, position, has_gauss, cached = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    python = states["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    name, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class ResumeState(Callback):
    """Exact resume: the random-number state in every checkpoint, and a checkpoint on SIGTERM.

    Random state. The shuffling order does not need it (the sampler derives it from seed and
    epoch, and the DataLoaders draw from generators of their own), but augmentation and
    dropout draw from the global generators: without them a resumed run would diverge from an
    uninterrupted one. Nothing draws from them between the checkpoint and the next batch
    (Lightning isolates the sanity check), so ``on_train_start`` restores the exact state for
    a checkpoint taken at an epoch's end and for one taken mid-epoch alike.

    Pre-emption. On SIGTERM, Lightning raises a ``SIGTERMException`` after the running optimizer
    step, on every rank; this writes ``preempted_filename`` next to the other checkpoints first,
    and the CLI exits with status 143 and says how to resume. Under SLURM, Lightning's own
    SIGUSR1 handler saves and requeues (see scripts/slurm.sbatch).
    """

    def __init__(self, preempted_filename: str = "preempted.ckpt") -> None:
        self.preempted_filename = preempted_filename
        self.preempted: Path | None = None  # where the checkpoint on SIGTERM went
        self._pending: dict[str, Any] | None = None

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[RNG_KEY] = collect_rng_states()

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._pending = checkpoint.get(RNG_KEY)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending is not None:
            restore_rng_states(self._pending)
            self._pending = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException) or trainer.checkpoint_callback is None:
            return
        directory = getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir
        self.preempted = Path(directory) / self.preempted_filename
        trainer.save_checkpoint(self.preempted)
        if trainer.is_global_zero:
            print(
                f"Stopped by SIGTERM after global step {trainer.global_step}; wrote {self.preempted}. "
                f"Resume with the same options and --ckpt_path {self.preempted}",
                file=sys.stderr,
            )
