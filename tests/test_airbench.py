"""airbench94's methods as pieces of the template (issue 29): each does what the paper says it does."""

import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import write_image_folder
from torch import nn

from template.data.augment import augment
from template.data.loaders import ResumableSampler, TensorImageDataset
from template.data_init import training_images
from template.evaluation import multi_crop_logits
from template.nets import AirbenchNet
from template.nets.layers import FrozenWeightBatchNorm, WhiteningConv, identity_init_
from template.optim import Lookahead
from template.schedule import WarmupLinear, build_optimizer, parameter_groups

REPO = Path(__file__).resolve().parents[1]


def test_whitening_filters_whiten_the_patches_of_the_images_they_were_fitted_on():
    torch.manual_seed(0)
    base = torch.randn(64, 1, 17, 17)
    noise = torch.randn(64, 2, 17, 17)
    # Correlated channels and neighbouring pixels, at different scales: far from white.
    images = torch.cat([base, 3 * base + noise[:, :1], 0.5 * base.roll(1, -1) + 0.2 * noise[:, 1:]], 1)
    stem = WhiteningConv(3, kernel_size=2, eps=1e-9)
    stem.fit(images)
    with torch.no_grad():
        out = nn.functional.conv2d(images, stem.weight[:12])  # the eigenvector filters, without their negatives
    flat = out.permute(0, 2, 3, 1).reshape(-1, 12).double()
    covariance = torch.cov(flat.T)
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.float64), atol=1e-3)
    assert torch.equal(stem.weight[12:], -stem.weight[:12]) and bool(stem.fitted)
    assert not stem.weight.requires_grad and stem.bias.requires_grad


def test_the_whitening_stem_is_fitted_when_the_fit_starts_on_images_of_every_class(run_cli, tmp_path):
    # An image folder lists its classes one after another: the first images would all be of one class.
    root = write_image_folder(tmp_path / "images", per_class=12, size=(32, 32))  # red, green and blue classes
    args = ["--data", "template.data.ImageFolderDataModule", "--data.root", str(root), "--data.num_workers", "0",
            "--data.batch_size", "8", "--model.net", "template.nets.AirbenchNet", "--model.net.widths", "[4, 8, 8]",
            "--model.net.whiten_images", "8", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1"]  # fmt: skip
    fitted = run_cli("fit", *args)
    stem, data = fitted.model.net.whiten, fitted.datamodule
    images = training_images(data, 8)
    assert len(set(images.mean(dim=(2, 3)).argmax(dim=1).tolist())) >= 2  # the dominant colour: the class
    expected = WhiteningConv(3, kernel_size=2)
    expected.fit(images)
    assert bool(stem.fitted) and torch.allclose(stem.weight, expected.weight)  # frozen since: as fitted


def test_identity_initialised_convolutions_pass_their_input_through():
    conv = identity_init_(nn.Conv2d(4, 6, 3, padding=1, bias=False))
    images = torch.randn(2, 4, 8, 8)
    assert torch.equal(conv(images)[:, :4], images)
    net = AirbenchNet(widths=[32, 32, 32])  # every convolution after the stem: (out, in) Dirac on the first in
    for conv in [m for m in net.blocks.modules() if isinstance(m, nn.Conv2d)]:
        assert torch.equal(
            conv.weight[: conv.in_channels], nn.init.dirac_(torch.empty_like(conv.weight[: conv.in_channels]))
        )


def test_frozen_weight_batchnorm_biases_learn_faster_and_decay_per_step_as_the_weights():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), FrozenWeightBatchNorm(4, bias_lr_scale=64.0))
    assert not net[1].weight.requires_grad
    groups = parameter_groups(net)
    optimizer = build_optimizer(partial(torch.optim.SGD, lr=0.5, weight_decay=0.01), None, groups, 10)
    by_name = {group["name"]: group for group in optimizer.param_groups}
    assert by_name["lr_x64"]["params"] == [net[1].bias] and by_name["lr_x64"]["lr"] == 32.0
    assert by_name["lr_x64"]["lr"] * by_name["lr_x64"]["weight_decay"] == pytest.approx(0.5 * 0.01)
    assert by_name["decay"]["lr"] == 0.5
    assert all(p is not net[1].weight for group in optimizer.param_groups for p in group["params"])  # frozen at 1


def test_lookahead_slow_weights_follow_its_rule():
    fast = nn.Parameter(torch.tensor([1.0, -2.0]))
    lookahead = Lookahead([fast], partial(torch.optim.SGD, lr=0.1), k=2, alpha=0.5)
    slow, expected = fast.detach().clone(), fast.detach().clone()
    for step in range(1, 7):
        lookahead.zero_grad()
        (fast**2).sum().backward()
        lookahead.step()
        expected = expected * 0.8  # SGD on x^2: x - 0.1 * 2x
        if step % 2 == 0:
            slow = slow + 0.5 * (expected - slow)
            expected = slow.clone()
        assert torch.allclose(fast.detach(), expected) and torch.allclose(lookahead.state[fast]["slow"], slow)
    assert lookahead.param_groups is lookahead.optimizer.param_groups  # schedules reach the inner optimizer
    ramp = Lookahead([nn.Parameter(torch.zeros(1))], k=5, alpha=0.25, alpha_power=3, total_steps=100)
    assert (
        ramp.alpha_at(0) == 1.0 and ramp.alpha_at(50) == pytest.approx(1 - 0.75 * 0.125) and ramp.alpha_at(100) == 0.25
    )


def test_lookahead_ends_on_the_slow_weights_and_resumes_from_its_state():
    fast = nn.Parameter(torch.tensor([1.0]))
    lookahead = Lookahead([fast], partial(torch.optim.SGD, lr=0.1, momentum=0.9), k=5, total_steps=7)
    for _ in range(7):
        lookahead.zero_grad()
        (fast**2).sum().backward()
        lookahead.step()
    assert torch.equal(fast.detach(), lookahead.state[fast]["slow"])  # the fast steps 6 and 7 are dropped
    other = Lookahead([nn.Parameter(fast.detach().clone())], partial(torch.optim.SGD, lr=0.1, momentum=0.9), k=5)
    other.load_state_dict(lookahead.state_dict())
    assert other.steps == 7 and other.param_groups is other.optimizer.param_groups
    assert len(other.optimizer.state_dict()["state"]) == 1  # the momentum buffer came back too


def test_lookahead_averages_the_batchnorm_statistics_with_the_weights():
    # The run ends on the slow weights: their BatchNorm statistics must be averaged alike, not left at the last
    # fast steps' (a network evaluated with another's statistics is silently worse).
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    make = partial(Lookahead, optimizer=partial(torch.optim.SGD, lr=0.1), k=2, alpha=0.5)
    lookahead = build_optimizer(make, None, parameter_groups(net), 10, net.buffers())
    before, after = [], []  # the running mean after each step's batch, and after its optimizer step
    for step in range(4):
        net(torch.randn(8, 3) + step).sum().backward()
        before.append(net[1].running_mean.clone())
        lookahead.step()
        lookahead.zero_grad()
        after.append(net[1].running_mean.clone())
    slow = before[0].lerp(before[1], 0.5)  # the slow copy starts at the first step
    assert torch.allclose(after[1], slow) and torch.equal(after[2], before[2])  # updated at step 2, not at 3
    assert torch.allclose(after[3], slow.lerp(before[3], 0.5)) and len(lookahead.slow_buffers) == 2  # not the count
    other = build_optimizer(make, None, parameter_groups(net), 10, net.buffers())
    other.load_state_dict(lookahead.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.slow_buffers, lookahead.slow_buffers))


@pytest.mark.parametrize(
    "damage",
    [{"slow_buffers": [1, "x"]}, {"slow_buffers": "x"}, {"steps": "3"}, {"optimizer": None}],
    ids=["buffers-not-tensors", "buffers-not-a-list", "steps-not-a-count", "no-inner-state"],
)
def test_a_damaged_lookahead_state_is_named_and_changes_nothing(damage):
    # The optimizer state comes from a checkpoint file: a damaged one must say so, not fail inside torch.
    net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    make = partial(Lookahead, optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9), k=2)
    lookahead = build_optimizer(make, None, parameter_groups(net), 10, net.buffers())
    net(torch.randn(8, 3)).sum().backward()
    lookahead.step()
    other = build_optimizer(make, None, parameter_groups(net), 10, net.buffers())
    with pytest.raises(ValueError, match="damaged"):
        other.load_state_dict(lookahead.state_dict() | damage)
    assert other.steps == 0 and not other.optimizer.state  # nothing half-loaded


def test_alternating_flip_mirrors_each_image_on_alternate_epochs():
    images = torch.arange(12 * 4, dtype=torch.uint8).view(12, 1, 2, 2)  # each image differs from its mirror
    sampler = ResumableSampler(TensorImageDataset(images, torch.zeros(12, dtype=torch.long)), 1, 0, seed=3)
    seen = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        flips = []
        for start in (0, 5, 10):  # batches of 5, 5 and 2, as the DataModule counts them
            sampler.consumed = start
            flips.append(sampler.alternating_flips(5))
        flips = torch.cat(flips)
        batch = images[torch.tensor(order)]
        out = augment(batch, 0, flips)
        assert torch.equal(out[flips], batch[flips].flip(3)) and torch.equal(out[~flips], batch[~flips])
        by_image = torch.zeros(12, dtype=torch.bool)
        by_image[torch.tensor(order)] = flips
        seen.append(by_image)
    assert torch.equal(seen[1], ~seen[0]) and torch.equal(seen[2], seen[0])  # alternate, from a coin in epoch 0
    assert 0 < int(seen[0].sum()) < 12


def test_multi_crop_evaluation_averages_the_crops_logits():
    weights = torch.randn(10, 3 * 6 * 6)

    def forward(images):
        return images.flatten(1) @ weights.T

    images = torch.randn(4, 3, 6, 6)
    padded = nn.functional.pad(images, (1, 1, 1, 1), mode="reflect")
    crops = [images, padded[..., :6, :6], padded[..., 2:, 2:]]
    per_crop = [(forward(crop) + forward(crop.flip(-1))) / 2 for crop in crops]
    expected = (per_crop[0] + (per_crop[1] + per_crop[2]) / 2) / 2
    assert torch.allclose(multi_crop_logits(forward, images, flip=True, translate=1), expected, atol=1e-5)
    assert torch.allclose(multi_crop_logits(forward, images, flip=True), per_crop[0])
    assert torch.equal(multi_crop_logits(forward, images, flip=False), forward(images))


def test_warmup_linear_rises_then_falls_linearly_to_zero():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    schedule = WarmupLinear(optimizer, total_steps=12, warmup_fraction=0.25)  # 3 warmup steps
    assert [schedule.lr_factor(step) for step in (0, 2, 3, 7, 12)] == pytest.approx([1 / 3, 1, 1, 5 / 9, 0])


def test_the_flop_count_of_a_tiny_config_equals_a_hand_computation(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from compute_to_accuracy import count
    from host_syncs import write_cifar

    monkeypatch.chdir(tmp_path)
    write_cifar(tmp_path / "cifar", per_file=20)  # 100 training images; val_fraction 0.2: 80 train
    counted = count(
        [
            "--config",
            str(REPO / "configs/cifar10_airbench.yaml"),
            "--data.root",
            str(tmp_path / "cifar"),
            "--data.val_fraction",
            "0.2",
            "--data.batch_size",
            "32",
            "--trainer.max_epochs",
            "3",
            "--model.net.widths",
            "[4, 8, 8]",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
        ]
    )

    def conv(cin, cout, side, k=3):  # forward multiply-adds, times 2 FLOPs
        return 2 * cin * cout * k * k * side * side

    # A 32x32 image: whiten 2x2 -> 31, blocks 31 -> 15 -> 7 -> 3 (each pools after its first conv).
    whiten = conv(3, 24, 31, k=2)
    convs = conv(24, 4, 31) + conv(4, 4, 15) + conv(4, 8, 15) + conv(8, 8, 7) + conv(8, 8, 7) + conv(8, 8, 3)
    head = 2 * 8 * 10
    # Backward: gradients of the inputs and of the weights of every convolution and of the head; none for the
    # frozen whitening filters, whose input needs no gradient either.
    per_image = whiten + convs + head + 2 * convs + 2 * head
    steps = [32, 32, 16]  # 80 images: two full batches and a last one of 16 (kept: at least half a batch)
    assert counted["steps_per_epoch"] == 3 and counted["images"] == 3 * 80
    assert counted["train_flops"] == 3 * sum(steps) * per_image
    assert counted["forward"] == whiten + convs + head and counted["views"] == 6
