"""Writes ``predict`` results as a CSV in the run directory."""

import csv
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter


class PredictionWriter(BasePredictionWriter):
    """Saves one row per predicted image: its id, the top class name and probability, and the top k.

    Args:
        filename: name of the CSV inside the run directory.
        top_k: how many of the most probable classes to list per image.
    """

    def __init__(self, filename: str = "predictions.csv", top_k: int = 3) -> None:
        super().__init__(write_interval="epoch")
        self.filename = filename
        self.top_k = top_k

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: list, batch_indices: list
    ) -> None:
        probabilities = torch.cat([batch.float().cpu() for batch in predictions])  # (N, K)
        indices = [int(index) for batch in batch_indices[0] for index in batch] if batch_indices else []
        if len(indices) != len(probabilities):
            indices = list(range(len(probabilities)))
        sample_ids = getattr(trainer.datamodule, "predict_ids", None)
        class_names = getattr(pl_module, "class_names", None) or [str(k) for k in range(probabilities.shape[1])]
        top_p, top_class = probabilities.topk(min(self.top_k, probabilities.shape[1]), dim=1)

        name = self.filename if trainer.world_size == 1 else f"{Path(self.filename).stem}-rank{trainer.global_rank}.csv"
        path = Path(trainer.log_dir or ".") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["sample", "class_name", "probability", f"top{self.top_k}"])
            for row, index in enumerate(indices):
                top = ";".join(
                    f"{class_names[k]}:{p:.4f}" for k, p in zip(top_class[row].tolist(), top_p[row].tolist())
                )
                sample = sample_ids[index] if sample_ids is not None else index
                writer.writerow([sample, class_names[top_class[row, 0]], f"{top_p[row, 0]:.6f}", top])
        print(f"Wrote {len(indices)} predictions to {path}")
