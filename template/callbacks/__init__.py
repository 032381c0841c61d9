"""Callbacks the default run turns on."""

from template.callbacks.predictions import PredictionWriter

__all__ = ["PredictionWriter"]
