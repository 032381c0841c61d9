"""The benchmark scripts stay runnable: tiny settings, and no timing is asserted."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def test_data_throughput_runs_end_to_end_and_reports_a_ratio():
    command = [sys.executable, "benchmarks/data_throughput.py", "--images", "400", "--epochs", "1", "--workers", "2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"ratio \(b\)/\(a\): [\d.]+x", result.stdout)
    assert re.search(r"ratio \(d\)/\(c\): [\d.]+x", result.stdout)  # the strong policy, both ways
    assert "one-off cache build" in result.stdout and "baseline ImageFolder" in result.stdout


def test_data_throughput_on_photos_makes_them_and_reports_random_resized_crops():
    command = [sys.executable, "benchmarks/data_throughput.py", "--image-size", "24", "--images", "60",
               "--batch-size", "8", "--epochs", "1", "--workers", "2"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "making 60 photo-like 500x375 JPEG files" in result.stdout
    assert "RandomResizedCrop(24)" in result.stdout and "random-resized crops" in result.stdout
    assert re.search(r"one-off cache build \(27x27\): [\d.]+ s = [\d.]+ x one baseline epoch", result.stdout)
    assert re.search(r"ratio \(b\)/\(a\): [\d.]+x \(target 5x\)", result.stdout)


@pytest.mark.slow
def test_overhead_benchmark_reports_per_step_overhead_and_the_ratio():
    command = [sys.executable, "benchmarks/overhead.py", "--repeats", "1", "--epochs", "1", "--pairs", "2",
               "--settings", "linear"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    number = r"-?[\d.]+"
    assert re.search(
        rf"linear per-step overhead: {number} ms from 2 paired epochs' step intervals \(quartiles {number} to "
        rf"{number}\); {number} ms from two run lengths of them \(18 and 4 steps; fixed {number} ms an epoch\)",
        result.stdout,
    )
    assert re.search(rf"linear bare Lightning, for scale: {number} ms a step over the plain loop", result.stdout)
    assert re.search(rf"linear ratio \(b\)/\(a\) per epoch: {number} from paired epochs", result.stdout)
    for figure in ("per_step_ms", "epoch_fixed_ms", "startup_s", "step_interval_ms", "epoch_interval_s"):
        assert figure in result.stdout


@pytest.mark.slow
def test_gpu_recipe_runs_end_to_end_on_the_cpu_with_smoke():
    environment = {**os.environ, "PYTHON": sys.executable}
    result = subprocess.run(["bash", "benchmarks/gpu_recipe.sh", "--smoke"], cwd=REPO, capture_output=True,
                            text=True, timeout=300, env=environment)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "configs/cifar10_fast.yaml" in result.stdout and "versions: torch" in result.stdout
    assert re.search(r"to 94%: +(not reached|[\d.]+ s of epochs)", result.stdout)
    assert re.search(r"speed: +[\d,]+ training images/s", result.stdout)
    assert re.search(r"host syncs over \d+ training steps", result.stdout)
    assert "syncs:    none paid by every step" in result.stdout
    assert re.search(r"test/acc: [\d.]+ \(final model", result.stdout)


def host_syncs(*options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "benchmarks/host_syncs.py", "--config", "configs/cifar10_fast.yaml", "--smoke", *options]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cifar10_fast_makes_no_host_sync_per_step():
    result = host_syncs()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "host syncs over 24 training steps" in result.stdout
    assert "steps with a sync that is not periodic: 0" in result.stdout
    # The probe sees syncs at all: Lightning reads the logged values back at its logging step.
    assert re.search(r"1 steps  logging steps +_local_scalar_dense from \S+ to_item  \(steps 19\)", result.stdout)


@pytest.mark.slow
def test_host_sync_probe_names_a_sync_every_step_pays():
    result = host_syncs("--nonfinite.check_every_n_steps", "1")  # the NaN guard looks before every step
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"24 steps  PER STEP +_local_scalar_dense from nonfinite.py:\d+ on_before_optimizer_step",
                     result.stdout)  # fmt: skip
    assert "steps with a sync that is not periodic: 22" in result.stdout  # all but the first and the logging step


def test_the_probe_counts_reads_back_that_call_no_operator_on_a_cpu_run(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    import host_syncs as probe_module

    probe, values = probe_module.SyncProbe(), torch.tensor([3, 1, 2])
    probe.step = 5  # inside a training step of a CPU run: every tensor stands for one on the GPU
    with probe:
        values.tolist(), values.numpy(), values.cpu(), torch.bincount(values), torch.histc(values.float())
        torch.histc(values.float(), bins=4, min=0, max=4)  # bounds given: nothing read back
    sources = sorted(name.split(" from ")[0] for name, _ in probe.syncs[5])
    assert sources == ["Tensor.cpu", "Tensor.numpy", "Tensor.tolist", "bincount", "histc"]
    assert all(" from test_benchmarks.py:" in name for name, _ in probe.syncs[5]), list(probe.syncs[5])
    probe.syncs.clear()
    values.tolist(), values.numpy()  # after the probe: torch's own methods again, nothing counted
    assert not probe.syncs
