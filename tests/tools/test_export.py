import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from template.checkpoints import load_weights
from template.commands import main
from template.nets import ResNetSmall
from template.tools.export import FORMATS, export


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from template.cli import cli

    runs = tmp_path_factory.mktemp("export") / "runs"
    cli([
        "fit", "--trainer.logger.init_args.save_dir", str(runs), "--trainer.callbacks", "[]",
        "--trainer.enable_progress_bar", "false", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "2",
    ])  # fmt: skip
    return next(runs.glob("digits/version_0/checkpoints/last.ckpt"))


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_export_passes_its_parity_check(checkpoint, tmp_path, fmt, capsys):
    path = export(checkpoint, fmt, tmp_path / f"net{FORMATS[fmt]}")
    assert path.is_file()
    printed = capsys.readouterr().out
    assert "parity: max |exported - original| =" in printed and "on a batch of 5" in printed


def test_safetensors_file_loads_into_a_fresh_network(checkpoint, tmp_path):
    path = export(checkpoint, "safetensors", tmp_path / "net.safetensors")
    original, fresh = ResNetSmall(10, 1).eval(), ResNetSmall(10, 1).eval()
    load_weights(original, checkpoint)
    fresh.load_state_dict(load_file(str(path)))  # no pickle involved
    images = torch.randn(3, 1, 8, 8)
    assert torch.equal(fresh(images), original(images))
    with safe_open(str(path), "pt") as file:
        metadata = file.metadata()
    assert json.loads(metadata["class_names"]) == [str(digit) for digit in range(10)]
    assert json.loads(metadata["net"])["class_path"] == "template.nets.ResNetSmall"


def test_a_parity_failure_fails_the_export(checkpoint, tmp_path):
    with pytest.raises(RuntimeError, match="differs from the original by"):
        export(checkpoint, "torchscript", tmp_path / "net.pt", tolerance=-1.0)


def test_export_refuses_doctored_checkpoints_and_runs_none_of_their_code(checkpoint, tmp_path, capsys):
    marker = tmp_path / "code-ran"
    payload = type("Payload", (), {"__reduce__": lambda self: (__import__("os").system, (f"touch {marker}",))})
    pickled = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"x": payload()}}, pickled)
    # Only tensors and plain values, but naming a class that is no network: it is never built.
    sneaky = tmp_path / "sneaky.ckpt"
    state = torch.load(checkpoint, weights_only=True)
    state["hyper_parameters"]["net"] = {
        "class_path": "subprocess.Popen",
        "init_args": {"args": f"touch {marker}", "shell": True},
    }
    torch.save(state, sneaky)
    for doctored, reason in ((pickled, "refusing to load"), (sneaky, "subprocess.Popen")):
        with pytest.raises(SystemExit) as exit_info:
            main(["export", "--ckpt_path", str(doctored), "--format", "safetensors"])
        assert exit_info.value.code == 1
        assert reason in capsys.readouterr().err
    assert not marker.exists()
