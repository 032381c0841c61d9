import contextlib
import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from template.checkpoints import (
    AtomicCheckpointIO,
    CheckpointError,
    UnsafeCheckpointError,
    check_checkpoint_is_safe,
    check_hub_file,
    check_like,
    check_optimizer_state,
    find_checkpoint,
    load_checkpoint,
    load_pretrained,
    load_weights,
)
from template.commands import main
from template.files import write_atomic
from template.nets import ResNetSmall
from template.restore import read_yaml

WRITER = """
import os, sys, torch
from template.checkpoints import AtomicCheckpointIO
path = sys.argv[1]
for line in sys.stdin:  # a writer per line, forked from here: the imports are paid once, not ten times
    pid = os.fork()
    if pid == 0:
        io, step = AtomicCheckpointIO(), int(line)
        while True:
            step += 1
            io.save_checkpoint({"step": step, "weights": torch.full((1_000_000,), float(step))}, path)
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("gone", flush=True)
"""


@pytest.mark.slow
def test_a_process_killed_while_writing_never_leaves_a_partial_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    rng = random.Random(0)
    kills_mid_write = 0
    forks = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    writer = None
    try:
        for kill in range(30):  # 10 kills, and more until one has landed mid-write (a loaded machine is slower)
            if kill >= 10 and kills_mid_write:
                break
            before = path.stat().st_mtime_ns if path.exists() else None
            forks.stdin.write(f"{1000 * kill}\n")
            forks.stdin.flush()
            writer = int(forks.stdout.readline())
            deadline = time.time() + 60
            while time.time() < deadline:  # wait until this writer is writing
                if path.exists() and path.stat().st_mtime_ns != before:
                    break
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(writer, signal.SIGKILL)
            assert forks.stdout.readline() == "gone\n"
            writer = None  # reaped: its pid may be another process's now
            kills_mid_write += any(tmp_path.glob(".last.ckpt.*.tmp"))
            checkpoint = torch.load(path, weights_only=True)  # whatever moment it died, this loads
            assert torch.all(checkpoint["weights"] == checkpoint["step"]) and checkpoint["step"] > 1000 * kill
    finally:
        for pid in (writer, forks.pid):  # a writer left running would write forever
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        forks.wait()
    assert kills_mid_write > 0  # the kills did land in the middle of writes


FULL_FILE = """
import resource, signal, sys, torch
from template.checkpoints import AtomicCheckpointIO
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG, as on a full disk
io, path = AtomicCheckpointIO(), sys.argv[1]
io.save_checkpoint({"step": 1}, path)
resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
io.save_checkpoint({"step": 2, "weights": torch.zeros(100_000)}, path)
"""


def test_a_write_that_fails_says_why_in_one_line_and_keeps_the_previous_file(tmp_path, monkeypatch):
    """Written by torch.save straight into the file, a failed write surfaced as torch's
    ``[enforce fail at inline_container.cc] unexpected pos``, whatever the reason."""
    path = tmp_path / "last.ckpt"
    result = subprocess.run([sys.executable, "-c", FULL_FILE, str(path)], capture_output=True, text=True)
    last = result.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"OSError: [Errno {errno.EFBIG}] could not write checkpoint {path}: File too large; the previous last.ckpt is intact"
    )
    assert torch.load(path, weights_only=True)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left behind

    def disk_full(descriptor):  # where a full disk often shows: the flush of delayed writes
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(
        OSError,
        match=rf"could not write checkpoint .*last.ckpt: the disk is full \({tmp_path}\); the previous last.ckpt is intact",
    ):
        AtomicCheckpointIO().save_checkpoint({"step": 3}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1 and [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_the_temporary_files_of_dead_writers_are_removed_by_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".best-epoch003.ckpt.{int(dead.stdout)}.tmp"  # another name than the next write's
    running = tmp_path / f".last.ckpt.{os.getppid()}.tmp"  # a writer still alive: its file is left alone
    stale.write_bytes(b"half"), running.write_bytes(b"half")
    others = tmp_path / f".thesis.tex.{int(dead.stdout)}.tmp"  # another program's, by the same convention
    others.write_bytes(b"a draft")
    AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "last.ckpt")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([running.name, others.name, "last.ckpt"])
    write_atomic(tmp_path / "cv.csv", "fold,acc\n")  # any other atomic write (an export, a table) removes its own only
    assert others.exists()


def test_the_previous_best_is_removed_only_once_the_new_best_is_on_disk(run_cli, monkeypatch):
    """ModelCheckpoint deletes the previous best right after it saves the new one: a write still in
    flight then (a writer thread on a slow disk) would leave no best checkpoint to a crash."""
    save, on_disk_at_removal = AtomicCheckpointIO.save_checkpoint, []

    def slow_disk(self, checkpoint, path, storage_options=None):
        time.sleep(0.2)
        save(self, checkpoint, path, storage_options)

    def remove(self, path):
        others = [p.name for p in Path(path).parent.glob("best-*.ckpt") if p.name != Path(path).name]
        on_disk_at_removal.append(others)
        Path(path).unlink(missing_ok=True)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", slow_disk)
    monkeypatch.setattr(AtomicCheckpointIO, "remove_checkpoint", remove)
    # epoch as the monitor: every epoch is a new best, so every epoch removes the one before.
    run_cli("fit", "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
            "--checkpoint.monitor", "epoch", "--checkpoint.mode", "max")  # fmt: skip
    assert on_disk_at_removal == [["best-epoch001.ckpt"], ["best-epoch002.ckpt"]]


class Payload:
    """Unpickling this runs a shell command: what a doctored checkpoint could do."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def doctored_checkpoint(tmp_path):
    marker, path = tmp_path / "code-ran", tmp_path / "doctored.ckpt"
    state = {f"net.{k}": v for k, v in ResNetSmall(10, 1).state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": {"payload": Payload(marker)}}, path)
    return path, marker


@pytest.mark.parametrize(
    "validation", [["--trainer.check_val_every_n_epoch", "2"], ["--trainer.val_check_interval", "0.3"]]
)
def test_last_ckpt_holds_the_last_step_when_validation_does_not_end_the_run(run_cli, validation):
    """ModelCheckpoint saves at validation's end unless told otherwise: with check_val_every_n_epoch 2, epoch 2 of
    three was in no file; with val_check_interval 0.3, the steps after an epoch's third validation."""
    epochs = ["--trainer.max_epochs", "3", "--trainer.limit_train_batches", "10", "--trainer.limit_val_batches", "1"]
    built = run_cli("fit", *epochs, *validation)
    last = torch.load(find_checkpoint("last", run_cli.runs_dir), map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (2, built.trainer.global_step) == (2, 30)


def test_the_doctored_checkpoint_really_runs_code_when_unpickled(tmp_path):
    path, marker = doctored_checkpoint(tmp_path)
    torch.load(path, weights_only=False)
    assert marker.exists()  # so the refusals below are what keeps it from running


def test_predict_refuses_a_checkpoint_that_would_run_code(tmp_path, capsys, monkeypatch):
    path, marker = doctored_checkpoint(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", "--ckpt_path", str(path)])
    assert exit_info.value.code == 1
    error = capsys.readouterr().err
    assert "refusing to load" in error and "system" in error and "Nothing from it was run" in error
    with pytest.raises(UnsafeCheckpointError):
        load_weights(ResNetSmall(10, 1), path)
    with pytest.raises(UnsafeCheckpointError):
        check_checkpoint_is_safe(path)
    assert not marker.exists()


def test_load_weights_of_a_file_of_no_tensors_names_the_file(tmp_path):
    """match_keys asked a number for its shape: "AttributeError: 'int' object has no attribute 'shape'"."""
    for name, saved in (("numbers.pt", {"stem.0.weight": 0}), ("text.pt", {"state_dict": "hello"})):
        torch.save(saved, tmp_path / name)
        with pytest.raises(CheckpointError, match=f"{tmp_path / name} holds no state_dict of named tensors"):
            load_weights(ResNetSmall(10, 1), tmp_path / name)


def test_load_weights_strips_wrapper_prefixes_and_names_mismatches(tmp_path, capsys):
    source = ResNetSmall(10, 1)
    wrapped = {f"net._orig_mod.{k}": v for k, v in source.state_dict().items()}  # compiled, inside the module
    wrapped = {f"module.{k}": v for k, v in wrapped.items()}  # and DDP around it all
    torch.save({"state_dict": wrapped}, tmp_path / "wrapped.ckpt")
    target = ResNetSmall(10, 1)
    load_weights(target, tmp_path / "wrapped.ckpt")
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))

    changed = ResNetSmall(5, 1)  # another head, and one layer more below
    changed.extra = nn.Linear(2, 2)
    with pytest.raises(
        RuntimeError,
        match=r"missing from the checkpoint: extra.bias, extra.weight.*head.weight \(10, 128\) vs \(5, 128\)",
    ):
        load_weights(changed, source.state_dict())
    load_weights(changed, source.state_dict(), strict=False)
    printed = capsys.readouterr().out
    assert "not loaded, missing from the checkpoint: extra.bias, extra.weight" in printed
    assert torch.equal(changed.stem[0].weight, source.stem[0].weight)  # the rest did load


class ChildCalledNet(nn.Module):
    """A network whose own child is called net (as many a user's is): its keys start net., as a module's do."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_network_with_a_child_called_net_loads_its_weights_from_a_checkpoint_and_a_state_dict(tmp_path, capsys):
    """Its net. was taken for the module's and dropped, twice by --weights_file: "4 of 4 tensors loaded" said of
    none loaded, the run trained on from random weights; its own state_dict file was refused as another network's."""
    source = ChildCalledNet()
    torch.save({"state_dict": {f"net.{k}": v for k, v in source.state_dict().items()}}, tmp_path / "module.ckpt")
    torch.save(source.state_dict(), tmp_path / "state_dict.pt")
    for path in (tmp_path / "module.ckpt", tmp_path / "state_dict.pt"):
        for load in (load_weights, lambda net, path: load_pretrained(net, path, "net.3")):
            target = ChildCalledNet()
            load(target, path)
            assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    assert "not loaded" not in capsys.readouterr().out
    other_head = ChildCalledNet(num_classes=3)  # another class count: all but the classifier
    load_pretrained(other_head, tmp_path / "module.ckpt", "net.3")
    assert torch.equal(other_head.net[1].weight, source.net[1].weight) and "2 of 4 tensors" in capsys.readouterr().out


def test_weights_of_complex_or_float8_values_are_refused_or_read_naming_the_tensor(tmp_path):
    """A complex tensor's real part was copied into a real weight, NaN and all, past the finiteness check; a float8
    tensor failed it with torch's "isfinite not implemented", naming no file."""
    weights = ResNetSmall(10, 1).state_dict()
    planted = {**weights, "stem.0.weight": torch.full_like(weights["stem.0.weight"], float("nan"), dtype=torch.cfloat)}
    torch.save(planted, tmp_path / "complex.pt")
    with pytest.raises(CheckpointError, match=r"complex.pt: its stem.0.weight is complex, which no real weight takes"):
        load_weights(ResNetSmall(10, 1), tmp_path / "complex.pt")
    eight = {**weights, "stem.0.weight": weights["stem.0.weight"].to(torch.float8_e4m3fn)}
    torch.save(eight, tmp_path / "float8.pt")
    load_weights(ResNetSmall(10, 1), tmp_path / "float8.pt")  # finite: read
    eight["stem.0.weight"] = torch.full_like(eight["stem.0.weight"], float("nan"))
    torch.save(eight, tmp_path / "float8.pt")
    with pytest.raises(CheckpointError, match=r"float8.pt: its stem.0.weight holds NaN or infinite values"):
        load_weights(ResNetSmall(10, 1), tmp_path / "float8.pt")


def test_load_checkpoint_reads_lightning_checkpoints(tmp_path):
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"net.w": torch.ones(2)}, "epoch": 3}, tmp_path / "a.ckpt")
    assert load_checkpoint(tmp_path / "a.ckpt")["epoch"] == 3


def test_a_resume_on_another_count_of_gpus_and_a_weights_file_of_other_tools_are_not_refused(tmp_path):
    state = torch.zeros(16, dtype=torch.uint8)  # a CUDA generator's state: one a visible device
    check_like({"rng_states": {"cuda": [state]}}, {"rng_states": {"cuda": [state, state]}}, "last.ckpt")
    torch.save({"state_dict": {"w": torch.ones(2)}, "best_epoch": -1}, tmp_path / "timm.pth")  # not Lightning's
    assert load_checkpoint(tmp_path / "timm.pth")["best_epoch"] == -1


def unblocked_after(fifo: Path, seconds: float) -> threading.Timer:
    """Opens ``fifo`` to write after ``seconds``, so that a reader waiting in open() returns (with nothing)."""

    def open_and_close() -> None:
        with contextlib.suppress(OSError):  # no reader waiting: nothing to unblock
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(seconds, open_and_close)
    timer.start()
    return timer


@pytest.mark.parametrize("reader", ["run config", "hub file"])
def test_a_fifo_where_a_file_from_elsewhere_is_read_is_refused_without_waiting(tmp_path, reader):
    """Opened to be read, a FIFO waits for a writer forever: every file from elsewhere is opened without waiting and
    refused unless it is a regular file, whatever it was when first looked at."""
    fifo = tmp_path / ("config.yaml" if reader == "run config" else "resnet18-f37072fd.pth")
    os.mkfifo(fifo)
    timer, started = unblocked_after(fifo, 5), time.monotonic()
    try:
        with pytest.raises((CheckpointError, OSError), match="no regular file"):
            read_yaml(fifo) if reader == "run config" else check_hub_file(fifo, "https://x/resnet18-f37072fd.pth")
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "make",
    [torch.optim.Adagrad, torch.optim.Adafactor, lambda p: torch.optim.SGD(p, lr=0.1), torch.optim.RMSprop],
    ids=["Adagrad", "Adafactor", "SGD without momentum", "RMSprop"],
)
def test_the_state_of_torchs_optimizers_after_a_step_is_never_refused(make):
    """Adagrad makes every parameter's state when built (step 0 for one no gradient reaches), Adafactor keeps factors
    of other shapes: a resume of either was refused as "damaged or made up"."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = make(list(net.parameters()))
    net[1](torch.randn(5, 3)).sum().backward()  # the first layer gets no gradient
    optimizer.step()
    shapes = [p.shape for group in optimizer.param_groups for p in group["params"]]
    check_optimizer_state(optimizer.state_dict(), shapes, "optimizer_states[0]", "run.ckpt", steps=1)
    state = optimizer.state_dict()
    for per_parameter in state["state"].values():
        per_parameter["step"] = torch.tensor(2.0)  # past the run's one step (SGD's keeps no count, nor anything here)
    with (
        contextlib.nullcontext()
        if not state["state"]
        else pytest.raises(CheckpointError, match=r"step is tensor\(2.\), not a count of the run's 1 optimizer steps")
    ):
        check_optimizer_state(state, shapes, "optimizer_states[0]", "run.ckpt", steps=1)
