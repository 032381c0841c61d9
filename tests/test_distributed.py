"""Scale: real multi-process DDP (gloo on CPU), torchrun across two 'nodes', accumulation, bf16,
channels_last, torch.compile and EMA."""

import copy
import csv
import re
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from conftest import write_image_folder
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from template import commands as cli_module
from template.checkpoints import CheckpointError
from template.data import DigitsDataModule, ImageFolderDataModule
from template.data.loaders import EvaluationSampler
from template.module import ClassificationModule
from template.nets import ResNetSmall

REPO = Path(__file__).resolve().parents[1]


def final_val_acc(run_dir: Path) -> float:
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events.Scalars("val/acc")[-1].value


def fit(cwd: Path, *args: str, launcher: list[str] | None = None, subcommand: str = "fit") -> subprocess.Popen:
    # With every default on, as users run it: the progress bar (on rank 0 only), the monitor, checkpoints.
    command = [*(launcher or [sys.executable]), "-m", "template", subcommand, *args]
    return subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"{process.args} did not finish in {timeout} s:\n{err[-4000:]}")
    assert process.returncode == 0, err[-4000:]
    return out + err


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_on_the_same_global_batch(tmp_path):
    common = ["--trainer.max_epochs", "5", "--data.global_batch_size", "64", "--trainer.accelerator", "cpu"]
    single = tmp_path / "single"
    single.mkdir()
    finished(fit(single, *common))
    ddp = tmp_path / "ddp"
    ddp.mkdir()
    # The config first: later options override it (its global batch of 512 among them).
    output = finished(fit(ddp, "--config", str(REPO / "configs/trainer/ddp.yaml"), *common, "--trainer.devices", "2"))
    assert "Starting with 2 processes" in output and "distributed_backend=gloo" in output
    assert [p.name for p in (ddp / "runs" / "digits").iterdir()] == ["version_0"]  # rank 0 alone wrote
    one, two = final_val_acc(single / "runs/digits/version_0"), final_val_acc(ddp / "runs/digits/version_0")
    assert one > 0.9 and abs(one - two) < 0.03, (one, two)


def test_an_evaluation_split_smaller_than_the_process_count_is_refused_not_left_to_hang(tmp_path):
    """A rank without images skips its epoch end, where the others wait for it in the metrics' all_gather."""
    root = write_image_folder(tmp_path / "images", per_class=1, splits=("train", "val"), size=(8, 8))
    data = ImageFolderDataModule(str(root), image_size=8, num_workers=0, cache_dir=str(tmp_path / "cache"))
    data.trainer = SimpleNamespace(world_size=4, global_rank=3)
    data.setup("validate")
    with pytest.raises(ValueError, match=r"the val split has 3 images for 4 processes, .* \(--trainer.devices 3\)"):
        data.val_dataloader()
    data.trainer.world_size = 3  # one each: the last rank's share is not empty
    assert [list(EvaluationSampler(data.datasets["val"], 3, rank)) for rank in range(3)] == [[0], [1], [2]]


@pytest.mark.slow
def test_two_process_evaluation_scores_each_image_once_as_one_process_does(tmp_path):
    """Nine validation images over two ranks: Lightning's DistributedSampler would score one of them twice."""
    root = write_image_folder(tmp_path / "images", per_class=3, splits=("train", "val", "test"), size=(8, 8))
    data = ["--config", str(REPO / "configs/imagefolder.yaml"), "--data.root", str(root), "--data.num_workers", "0"]
    data += ["--data.image_size", "8", "--data.batch_size", "4", "--trainer.accelerator", "cpu"]
    finished(fit(tmp_path, *data, "--trainer.max_epochs", "2"))
    checkpoint = ["--ckpt_path", "last", *data, "--config", str(REPO / "configs/trainer/ddp.yaml")]
    two = finished(fit(tmp_path, *checkpoint, "--trainer.devices", "2", subcommand="validate"))
    one = finished(fit(tmp_path, *checkpoint, "--trainer.devices", "1", subcommand="validate"))
    scored = [re.search(r"val/acc (\S+) on (\d+) images \((.*)\)", output).groups() for output in (one, two)]
    assert scored[0] == scored[1] and scored[0][1:] == ("9", "the whole split"), scored


@pytest.mark.slow
def test_two_process_ddp_with_every_default_finishes_three_runs_in_a_row(tmp_path):
    # The README's CPU hint. Every rank must join each collective in the same order. Rank 0's
    # progress bar, the one callback that runs on rank 0 alone, once computed the epoch's train/acc
    # (an all_gather) in on_train_epoch_end; the other rank computed it later, after the collectives
    # of the hooks between: TrainingMonitor's log_dir broadcast (every run) and, in the second run,
    # NonFiniteGuard's check of its pending steps (no validation in epoch 0 flushes them first).
    # On rank 1 the bar, disabled, also failed an assertion on fast validation batches.
    tiny = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"]
    ddp = ["--config", str(REPO / "configs/trainer/ddp.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    pending_check = ["--nonfinite.check_every_n_steps", "3", "--trainer.check_val_every_n_epoch", "2"]
    for extra in ([], pending_check, []):
        output = finished(fit(tmp_path, *ddp, "--data.global_batch_size", "64", *tiny, *extra), timeout=180)
        assert "run summary" in output
    runs = tmp_path / "runs" / "digits"
    assert sorted(p.name for p in runs.iterdir()) == ["version_0", "version_1", "version_2"]
    rows = list(csv.DictReader((runs / "version_2" / "metrics.csv").open()))
    assert [row["epoch"] for row in rows] == ["0", "1"] and all(float(row["train/acc"]) > 0 for row in rows)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_listener(port: int, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


@pytest.mark.slow
def test_torchrun_across_two_nodes_on_localhost_writes_one_run_directory(tmp_path):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    port = free_port()

    def node(rank: int) -> subprocess.Popen:
        launcher = [torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                    "--master-addr", "127.0.0.1", "--master-port", str(port)]  # fmt: skip
        return fit(
            tmp_path, "--trainer.num_nodes", "2", "--trainer.devices", "1", "--trainer.strategy", "ddp",
            "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1", launcher=launcher,
        )  # fmt: skip

    # Node 0 hosts the rendezvous store on the master port; node 1 joins once it listens.
    nodes = [node(0)]
    try:
        wait_for_listener(port)
        nodes.append(node(1))
        outputs = [finished(process, timeout=240) for process in nodes]  # both agents exit 0
    finally:
        for process in nodes:  # never leave a node waiting for its partner
            if process.poll() is None:
                process.kill()
    assert not any("terminate called" in output for output in outputs)  # no worker aborted at exit
    assert "run summary" in outputs[0] and "run summary" not in outputs[1]  # rank 0 prints, rank 1 does not
    runs = tmp_path / "runs" / "digits"
    assert [p.name for p in runs.iterdir()] == ["version_0"]
    assert (runs / "version_0" / "checkpoints" / "last.ckpt").is_file() and (runs / "version_0" / "env.json").is_file()


def test_main_tears_down_the_process_group_it_trained_in(monkeypatch, tmp_path):
    # A gloo group left up at interpreter exit can abort a worker that finished, and torchrun
    # then fails the whole run (seen on this machine, about one run in eight).
    def train(args):
        store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)

    monkeypatch.setattr(cli_module, "cli", train)
    cli_module.main(["fit"])
    assert not torch.distributed.is_initialized()


def one_step(batch_size: int, accumulate: int) -> nn.Module:
    L.seed_everything(0, workers=True)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))  # no BatchNorm: the batch split changes nothing
    model = ClassificationModule(net, optimizer=partial(torch.optim.SGD, lr=0.5), lr_scheduler=None)
    data = DigitsDataModule(batch_size=batch_size, crop_padding=0)
    trainer = L.Trainer(
        max_steps=1, accumulate_grad_batches=accumulate, limit_val_batches=0, logger=False, accelerator="cpu",
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=data)
    return net


def test_accumulating_two_batches_of_64_equals_one_batch_of_128():
    accumulated, large = one_step(64, accumulate=2), one_step(128, accumulate=1)
    L.seed_everything(0)
    untouched = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    assert not torch.allclose(untouched[1].weight, large[1].weight)  # a step was taken
    torch.testing.assert_close(accumulated[1].weight, large[1].weight, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(accumulated[1].bias, large[1].bias, atol=1e-6, rtol=1e-5)


def test_bf16_mixed_trains_on_the_cpu(run_cli):
    run = run_cli("fit", "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "3")
    assert run.trainer.precision == "bf16-mixed"
    assert run.trainer.callback_metrics["val/acc"] > 0.7
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


@pytest.mark.parametrize(
    "global_batch, world_size, accumulate, expected", [(64, 2, 1, 32), (512, 8, 1, 64), (64, 1, 1, 64), (64, 2, 2, 16)]
)
def test_global_batch_is_shared_out_across_processes_and_accumulated_batches(
    global_batch, world_size, accumulate, expected
):
    assert DigitsDataModule(global_batch_size=global_batch).device_batch_size(world_size, accumulate) == expected


def test_a_global_batch_is_the_optimizer_steps_under_accumulation_too(run_cli):
    """It was each batch's: accumulating 3 made a step of 90 images where 30 were asked for."""
    global_batch = ["--data.global_batch_size", "30", "--trainer.accumulate_grad_batches", "3"]
    built = run_cli("fit", *global_batch, "--trainer.max_steps", "2", "--trainer.limit_val_batches", "1")
    assert built.trainer.train_dataloader.batch_size == 10 and built.trainer.global_step == 2


def test_a_global_batch_that_does_not_divide_is_a_clear_error():
    with pytest.raises(ValueError, match=r"global_batch_size=100 does not divide by the 3 processes.*e.g. 102"):
        DigitsDataModule(global_batch_size=100).device_batch_size(3)
    with pytest.raises(ValueError, match=r"batch_size=64 does not divide by the 3 processes.*e.g. 66"):
        DigitsDataModule(global_batch_size="batch_size").device_batch_size(3)
    with pytest.raises(ValueError, match=r"=64 does not divide by the 3 processes .* x 2 accumulated batches.*e.g. 66"):
        DigitsDataModule(global_batch_size=64).device_batch_size(3, 2)


@pytest.mark.parametrize("given, per_device", [([], 32), (["--data.batch_size", "32"], 16)])
def test_the_ddp_config_shares_out_the_runs_own_batch(given, per_device):
    """configs/trainer/ddp.yaml composed with any run: its batch (the digits' 64, or one given) is the global batch;
    it once set 512 whatever the run's, and a --data.batch_size given beside it was ignored without a word."""
    ddp = ["--config", str(REPO / "configs/trainer/ddp.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    built = cli_module.cli([*ddp, *given], run=False)
    assert built.datamodule.device_batch_size(built.trainer.world_size) == per_device


def test_slurm_script_is_valid_and_asks_for_lightnings_requeue_signal():
    script = REPO / "scripts" / "slurm.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert "#SBATCH --signal=SIGUSR1@90" in text and "srun python -m template fit" in text
    for config in ("configs/cifar10_resnet18.yaml", "configs/trainer/ddp_multinode.yaml"):
        assert config in text and (REPO / config).is_file()


def test_channels_last_keeps_weights_and_inputs_nhwc_and_the_outputs_unchanged():
    L.seed_everything(0)
    plain = ClassificationModule(ResNetSmall(10, 1)).eval()
    nhwc = ClassificationModule(copy.deepcopy(plain.net), channels_last=True).eval()
    nhwc.setup("fit")
    conv = nhwc.net.stages[0][0].conv1.weight  # (32, 32, 3, 3): NHWC differs from NCHW
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randn(4, 1, 8, 8)
    torch.testing.assert_close(nhwc(images), plain(images), atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_compile_is_opt_in_and_keeps_the_checkpoint_keys(run_cli):
    steps = ["--trainer.max_steps", "2", "--trainer.limit_val_batches", "1"]
    compiled = run_cli("fit", "--model.compile", "true", *steps)
    assert compiled.model.net._compiled_call_impl is not None  # training ran through torch.compile
    checkpoint = torch.load(run_cli.runs_dir / "digits/version_0/checkpoints/last.ckpt", weights_only=True)
    eager = ClassificationModule(ResNetSmall(10, 1))
    assert set(checkpoint["state_dict"]) == set(eager.state_dict())  # no `_orig_mod.` prefixes
    assert run_cli("fit", *steps).model.net._compiled_call_impl is None  # off by default


def test_ema_weights_are_validated_checkpointed_and_kept_at_the_end(run_cli):
    run = run_cli(
        "fit", "--trainer.max_epochs", "2", "--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging",
        "--trainer.callbacks.decay", "0.9",
    )  # fmt: skip
    checkpoint = torch.load(run_cli.runs_dir / "digits/version_0/checkpoints/last.ckpt", weights_only=True)
    ema, raw = checkpoint["state_dict"], checkpoint["current_model_state"]  # EMA is what predict/export load
    assert not torch.equal(ema["net.head.weight"], raw["net.head.weight"])
    for name, value in run.model.state_dict().items():  # at the end, training leaves the EMA weights
        torch.testing.assert_close(value, ema[name], msg=name)
    with pytest.raises(
        CheckpointError, match=r"to resume: it was trained with callback\(s\) EMAWeightAveraging, whose"
    ):
        run_cli("fit", "--ckpt_path", "last", "--trainer.max_epochs", "3")  # from the average, EMA dropped, unsaid
    ema = ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging", "--trainer.callbacks.decay", "0.9"]
    resumed = run_cli("fit", "--ckpt_path", "last", "--trainer.max_epochs", "3", *ema)  # its states pass the checks
    assert resumed.trainer.current_epoch == 3


@pytest.mark.slow
def test_two_process_ddp_trains_a_timm_network_with_the_fine_tuning_recipe(tmp_path):
    """timm's network, its layer-wise LR decay, the frozen-then-unfrozen backbone and EMA weights (whose copy of the
    module shares its optimizer factories: jsonargparse's hold the DDP launcher's processes), across two processes."""
    pytest.importorskip("timm")
    timm_net = ["--model.net", "template.nets.timm_net", "--model.net.name", "mobilenetv3_small_050"]
    recipe = ["--model.layer_decay", "0.7", "--trainer.callbacks+=template.callbacks.FreezeBackbone"]
    recipe += ["--trainer.callbacks+=lightning.pytorch.callbacks.EMAWeightAveraging"]
    ddp = ["--config", str(REPO / "configs/trainer/ddp.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    tiny = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]
    output = finished(fit(tmp_path, *ddp, *timm_net, *recipe, "--data.global_batch_size", "64", *tiny), timeout=300)
    assert "run summary" in output and "Starting with 2 processes" in output
    assert [p.name for p in (tmp_path / "runs" / "digits").iterdir()] == ["version_0"]  # rank 0 alone wrote


PROBE = '''
import lightning as L
import torch


class WhiteningProbe(L.Callback):
    """Saves this rank's whitening filters as training starts (after the stem was fitted and broadcast)."""

    def on_train_start(self, trainer, pl_module):
        torch.save(pl_module.net.whiten.weight.detach().clone(), f"whiten_rank{trainer.global_rank}.pt")
'''


@pytest.mark.slow
def test_two_process_ddp_fits_the_whitening_stem_on_rank_zero_and_every_rank_gets_it(tmp_path):
    from conftest import write_image_folder

    (tmp_path / "probe.py").write_text(PROBE)  # python -m puts the working directory on the path
    root = write_image_folder(tmp_path / "images", per_class=12, size=(32, 32))
    data = ["--data", "template.data.ImageFolderDataModule", "--data.root", str(root), "--data.num_workers", "0"]
    net = [
        "--model.net",
        "template.nets.AirbenchNet",
        "--model.net.widths",
        "[4, 8, 8]",
        "--model.net.whiten_images",
        "8",
    ]
    ddp = ["--config", str(REPO / "configs/trainer/ddp.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    tiny = ["--data.global_batch_size", "8", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"]
    finished(fit(tmp_path, *ddp, *data, *net, *tiny, "--trainer.callbacks+=probe.WhiteningProbe"))
    zero, one = torch.load(tmp_path / "whiten_rank0.pt"), torch.load(tmp_path / "whiten_rank1.pt")
    assert torch.equal(zero, one) and zero.abs().sum() > 0
    checkpoint = torch.load(next((tmp_path / "runs").rglob("last.ckpt")), weights_only=True)
    assert torch.equal(checkpoint["state_dict"]["net.whiten.weight"], zero)
    assert bool(checkpoint["state_dict"]["net.whiten.fitted"])
