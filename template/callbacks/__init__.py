"""Callbacks the default run turns on."""

from template.callbacks.finetune import FreezeBackbone
from template.callbacks.monitor import TrainingMonitor
from template.callbacks.nonfinite import NonFiniteError, NonFiniteGuard
from template.callbacks.predictions import PredictionWriter
from template.callbacks.progress import ThrottledProgressBar
from template.callbacks.resume import ResumeState
from template.callbacks.run_record import RunRecord

__all__ = [
    "FreezeBackbone",
    "NonFiniteError",
    "NonFiniteGuard",
    "PredictionWriter",
    "ResumeState",
    "RunRecord",
    "ThrottledProgressBar",
    "TrainingMonitor",
]
