"""Training-time observability, read back through a real TensorBoard server's HTTP API."""

import csv
import io
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from PIL import Image

from template.callbacks.monitor import heatmap


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


@pytest.mark.slow
def test_tensorboard_serves_the_curves_the_confusion_matrix_and_the_misclassified(run_cli):
    run = run_cli("fit", "--trainer.max_epochs", "2", "--trainer.log_every_n_steps", "5")
    run_dir = Path(run.trainer.log_dir)
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [row["epoch"] for row in rows] == ["0", "1"]
    assert float(rows[-1]["val/acc"]) > 0 and float(rows[-1]["train/images_per_sec"]) > 0

    port = free_port()
    tensorboard = Path(sys.executable).parent / "tensorboard"
    server = subprocess.Popen(
        [str(tensorboard), "--logdir", str(run_dir), "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}/data/plugin"
        deadline, scalars, images = time.time() + 90, {}, {}
        while time.time() < deadline and not (scalars.get(".") and images.get(".")):
            try:
                scalars = json.loads(get(f"{base}/scalars/tags"))
                images = json.loads(get(f"{base}/images/tags"))
            except OSError:
                pass
            time.sleep(0.5)
        tags = set(scalars["."])
        assert {"train/loss", "val/loss", "val/acc", "lr/decay", "train/grad_norm", "train/images_per_sec"} <= tags
        assert {"val/confusion_matrix", "val/misclassified"} <= set(images["."])
        entries = json.loads(get(f"{base}/images/images?run=.&tag=val/confusion_matrix"))
        picture = Image.open(io.BytesIO(get(f"{base}/images/individualImage?{entries[-1]['query']}")))
        assert picture.size == (160, 160)  # ten classes, 16 pixels a cell
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_metrics_csv_rows_hold_only_the_values_of_their_own_epoch(run_cli):
    # 3 steps an epoch, logged every 5: step 5 falls in epoch 1, step 10 in epoch 3, none in epoch 2;
    # validation runs after epochs 1 and 3 only.
    run = run_cli("fit", "--trainer.max_epochs", "4", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches",
                  "2", "--trainer.log_every_n_steps", "5", "--trainer.check_val_every_n_epoch", "2")  # fmt: skip
    rows = list(csv.DictReader((Path(run.trainer.log_dir) / "metrics.csv").open()))
    logged = [{key for key, value in row.items() if value} for row in rows]
    every_epoch = {"epoch", "step", "lr", "train/loss", "train/acc", "train/epoch_time", "train/images_per_sec"}
    at_steps = {"train/grad_norm", "lr/decay", "lr/no_decay"}
    validation = {"val/loss", "val/acc"}
    logging_epoch = every_epoch | at_steps | validation
    assert logged == [every_epoch, logging_epoch, every_epoch, logging_epoch]
    assert rows[1]["train/grad_norm"] != rows[3]["train/grad_norm"]


def test_heatmap_normalises_rows_and_marks_the_diagonal():
    image = heatmap(torch.tensor([[8, 2], [0, 5]]), cell=4)
    assert image.shape == (3, 8, 8)
    assert torch.allclose(image[:, 0, 0], torch.tensor([0.82, 0.74, 0.16]))  # 80% of row 0: near yellow
    assert torch.allclose(image[:, 4, 0], torch.tensor([0.1, 0.1, 0.4]))  # none: dark blue
    assert torch.allclose(image[:, 4, 4], torch.tensor([1.0, 0.9, 0.1]))  # all of row 1


def test_each_metrics_csv_row_holds_its_own_epochs_train_acc(run_cli):
    # The module logs train/acc from its on_train_epoch_end, which Lightning calls after the
    # monitor's: a row written at the monitor's hook would carry the previous epoch's value.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_cli("fit", "--trainer.max_epochs", "3")
    run_dir = Path(run.trainer.log_dir)
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    events = EventAccumulator(str(run_dir))
    events.Reload()
    logged = [round(event.value, 4) for event in events.Scalars("train/acc")]
    assert [row["epoch"] for row in rows] == ["0", "1", "2"] and len(set(logged)) == 3
    assert [round(float(row["train/acc"]), 4) for row in rows] == logged


def test_a_resumed_metrics_table_larger_than_a_run_writes_is_not_taken():
    """metrics.csv is rows times names cells, written at every checkpoint: a few MB of a checkpoint (one row of
    20,000 names, the same small row 200,000 times) made gigabytes of it."""
    from template.callbacks.monitor import TrainingMonitor

    monitor, row = TrainingMonitor(), {"epoch": 0}
    monitor.load_state_dict({"rows": [{f"m{i}": 0.0 for i in range(2_000)}]})
    monitor.load_state_dict({"rows": [row] * 200_000})
    assert monitor.rows == []
    monitor.load_state_dict({"rows": [{"epoch": 0, "val/acc": 0.5}, {"epoch": 1, "val/acc": 0.6}]})
    assert len(monitor.rows) == 2


def test_an_epoch_resumed_within_goes_on_with_its_own_time_images_and_learning_rate(run_cli):
    """Resumed within an epoch (here stopped at max_steps; a pre-emption alike), no epoch starts: its row had the
    machine's uptime as epoch_time, 0.001 images/s, the learning rate at the resume, and came beside the first part's."""
    quick = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "1"]
    started = time.perf_counter()
    first = run_cli("fit", *quick, "--trainer.max_steps", "3")
    metrics = Path(first.trainer.log_dir) / "metrics.csv"
    [part] = list(csv.DictReader(metrics.open()))
    run_cli("fit", *quick, "--trainer.max_steps", "6", "--ckpt_path", "last")  # to the end of the epoch
    elapsed = time.perf_counter() - started
    [row] = list(csv.DictReader(metrics.open()))  # one row for the epoch, the whole of it
    assert row["epoch"] == "0" and row["step"] == "6" and row["lr"] == part["lr"]  # the LR it started with
    assert float(part["train/epoch_time"]) < float(row["train/epoch_time"]) < elapsed
    assert float(row["train/images_per_sec"]) > 6 * 64 / elapsed  # 6 batches of 64 images, timed in this test


def test_metrics_csv_train_loss_is_the_epochs_mean_not_its_last_step(run_cli):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = run_cli("fit", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches",
                  "1", "--trainer.log_every_n_steps", "1")  # fmt: skip
    rows = list(csv.DictReader((Path(run.trainer.log_dir) / "metrics.csv").open()))
    events = EventAccumulator(run.trainer.log_dir)
    events.Reload()
    steps = {event.step: event.value for event in events.Scalars("train/loss")}  # every step's, full batches
    for epoch, row in enumerate(rows):
        mean = sum(steps[step] for step in range(4 * epoch, 4 * epoch + 4)) / 4
        assert float(row["train/loss"]) == pytest.approx(mean, abs=1e-5), epoch
        assert float(row["train/loss"]) != pytest.approx(steps[4 * epoch + 3], abs=1e-5)  # not the last step's
