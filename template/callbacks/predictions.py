"""Writes ``predict`` results as a CSV in the run directory."""

import csv
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from template.files import replaced_atomically


def spreadsheet_safe(cell: object) -> str:
    """``cell`` as text no spreadsheet runs (a leading apostrophe before a formula: CSV injection) and no terminal
    obeys (escape sequences written out: ``cat`` of the file shows them, not their effect): names from a file. Written
    as Python writes a string's characters, a backslash and a leading apostrophe too: no two names read alike."""
    cell = "".join(char if char.isprintable() and char != "\\" else repr(char)[1:-1] for char in str(cell))
    return f"'{cell}" if cell[:1] in ("=", "+", "-", "@", "'") else cell


class PredictionWriter(BasePredictionWriter):
    """Saves one row per predicted image in ``filename`` in the run directory: its id, then the ``top_k`` most
    probable classes and their probabilities, each in a column of its own, never as formulas."""

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
        if not (finite := probabilities.isfinite().all(dim=1)).all():  # its argmax would pass for an answer
            first = indices[int((~finite).nonzero()[0])]
            raise FloatingPointError(  # not a ValueError: said by the rank that found it, whichever it is
                f"the network's outputs are NaN or infinite for {int((~finite).sum())} of {len(finite)} images (the "
                f"first: {sample_ids[first] if sample_ids is not None else first}): no class is their answer, and this "
                "process wrote no predictions. Its weights give them (a BatchNorm running_var below 0, values past the "
                "precision's range): check the checkpoint, or predict in 32-bit (--trainer.precision 32-true)"
            )
        class_names = getattr(pl_module, "class_names", None) or [str(k) for k in range(probabilities.shape[1])]
        top_p, top_class = probabilities.topk(min(self.top_k, probabilities.shape[1]), dim=1)
        name = self.filename if trainer.world_size == 1 else f"{Path(self.filename).stem}-rank{trainer.global_rank}.csv"
        path = Path(trainer.log_dir or ".") / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # The most probable class is class_name itself; the next ones are top2_class, top2_probability...
        others = [f"top{r}_{c}" for r in range(2, top_class.shape[1] + 1) for c in ("class", "probability")]
        with replaced_atomically(path) as temporary, temporary.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["sample", "class_name", "probability", *others])
            for row, index in enumerate(indices):
                cells = [str(sample_ids[index] if sample_ids is not None else index)]
                for k, p in zip(top_class[row].tolist(), top_p[row].tolist()):
                    cells += [class_names[k], f"{p:.6f}"]
                writer.writerow([spreadsheet_safe(cell) for cell in cells])
        print(f"Wrote {len(indices)} predictions to {path}")
