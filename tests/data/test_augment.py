import pytest
import torch
from torchvision.transforms import RandomResizedCrop
from torchvision.transforms.v2 import functional as TF

from template.data.augment import (  # one name a line: a renamed project's longer package name fits
    augment,
    center_crop,
    channel_stats,
    crop_boxes,
    mix,
    normalize,
    random_crop,
    random_erasing,
    random_hflip,
    resize_batch,
    resize_each,
)


def images() -> torch.Tensor:
    return torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).reshape(2, 3, 6, 6)


def test_random_crop_keeps_shape_and_dtype_and_is_seeded():
    batch = images()
    torch.manual_seed(1)
    a = random_crop(batch, 2)
    torch.manual_seed(1)
    b = random_crop(batch, 2)
    assert a.shape == batch.shape and a.dtype == batch.dtype
    assert torch.equal(a, b)
    assert not all(torch.equal(random_crop(batch, 2), a) for _ in range(5))
    assert torch.equal(random_crop(batch, 0), batch)


def test_random_crop_is_a_shifted_window_of_the_reflect_padded_image():
    batch = images()
    padded = torch.nn.functional.pad(batch, (1, 1, 1, 1), mode="reflect")
    windows = [padded[:, :, top : top + 6, left : left + 6] for top in range(3) for left in range(3)]
    torch.manual_seed(0)
    cropped = random_crop(batch, 1)
    for index in range(len(batch)):
        assert any(torch.equal(cropped[index], window[index]) for window in windows)


def test_random_hflip_mirrors_whole_images():
    batch = images()
    flipped = random_hflip(batch, probability=1.0)
    assert torch.equal(flipped, batch.flip(3))
    assert torch.equal(random_hflip(batch, probability=0.0), batch)
    torch.manual_seed(0)
    mixed = random_hflip(batch.repeat(16, 1, 1, 1))
    mirrored = [torch.equal(image, original.flip(2)) for image, original in zip(mixed, batch.repeat(16, 1, 1, 1))]
    assert 0 < sum(mirrored) < len(mirrored)


def test_normalize_accepts_uint8_and_float():
    batch = torch.full((1, 2, 2, 2), 255, dtype=torch.uint8)
    mean, std = torch.tensor([0.5, 1.0]), torch.tensor([0.5, 1.0])
    out = normalize(batch, mean, std)
    assert out.dtype == torch.float32
    assert torch.allclose(out[0, 0], torch.ones(2, 2)) and torch.allclose(out[0, 1], torch.zeros(2, 2))
    assert torch.equal(normalize(batch.float() / 255, mean, std), out)


def test_augment_shifts_then_mirrors_uint8_batches_and_does_nothing_when_off():
    batch = (images() % 256).to(torch.uint8)
    assert torch.equal(augment(batch, crop_padding=0, hflip=False), batch)
    torch.manual_seed(0)
    augmented = augment(batch.repeat(8, 1, 1, 1), crop_padding=1, hflip=True)
    assert augmented.dtype == torch.uint8 and augmented.shape == (16, 3, 6, 6)
    padded = torch.nn.functional.pad(batch.float(), (1, 1, 1, 1), mode="reflect").to(torch.uint8)
    windows = [padded[:, :, top : top + 6, left : left + 6] for top in range(3) for left in range(3)]
    mirrored = 0
    for index, image in enumerate(augmented):  # image `index` is a copy of batch[index % 2]
        views = [window[index % 2] for window in windows]
        shifted = any(torch.equal(image, view) for view in views)
        flipped = any(torch.equal(image, view.flip(2)) for view in views)
        assert shifted or flipped
        mirrored += flipped and not shifted
    assert 0 < mirrored < 16


@pytest.mark.parametrize("policy", ["trivialaugment", "randaugment"])
def test_a_policy_draws_an_operation_per_group_not_one_for_the_whole_batch(policy):
    # 64 copies of one image: one draw for the batch would leave all 64 alike.
    batch = (images()[:1] % 256).to(torch.uint8).repeat(64, 1, 1, 1)
    torch.manual_seed(0)
    augmented = augment(batch, crop_padding=0, hflip=False, policy=policy)
    assert augmented.dtype == torch.uint8 and augmented.shape == batch.shape
    assert len({image.numpy().tobytes() for image in augmented}) > 2
    torch.manual_seed(0)
    assert torch.equal(augment(batch, crop_padding=0, hflip=False, policy=policy), augmented)  # seeded


def test_random_erasing_erases_to_zero_in_different_places_and_not_when_off():
    batch = torch.ones(64, 3, 16, 16)
    torch.manual_seed(0)
    erased = random_erasing(batch, probability=1.0)
    assert torch.all((erased == 0) | (erased == 1)) and erased.eq(0).any(dim=(1, 2, 3)).all()
    assert len({tuple(image[0].eq(0).nonzero()[0].tolist()) for image in erased}) > 2  # corners differ
    assert torch.equal(random_erasing(batch, probability=0.0), batch)


@pytest.mark.parametrize("mixup_alpha, cutmix_alpha", [(0.2, 0.0), (0.0, 1.0), (0.2, 1.0)])
def test_mix_gives_probability_labels_and_mixed_images(mixup_alpha, cutmix_alpha):
    batch, labels = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 1, 16, 16), torch.arange(8) % 4
    torch.manual_seed(0)
    draws = [mix(batch, labels, 4, mixup_alpha, cutmix_alpha) for _ in range(5)]
    for mixed, soft in draws:
        assert mixed.shape == batch.shape and soft.shape == (8, 4) and soft.dtype == torch.float32
        torch.testing.assert_close(soft.sum(dim=1), torch.ones(8))
    assert any(not torch.equal(mixed, batch) and soft.max() < 1 for mixed, soft in draws)
    plain = mix(batch, labels, 4, 0.0, 0.0)
    assert plain[0] is batch and plain[1] is labels


@pytest.mark.parametrize("height, width", [(37, 37), (30, 90)], ids=["square", "wider than the ratios"])
def test_crop_boxes_are_drawn_as_torchvision_draws_them(height, width):
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    torch.manual_seed(0)
    ours = crop_boxes(4000, height, width, scale, ratio, torch.device("cpu")).float()
    theirs = torch.tensor([RandomResizedCrop.get_params(torch.empty(1, height, width), list(scale), list(ratio))
                           for _ in range(4000)]).float()  # fmt: skip
    top, left, heights, widths = ours.T
    assert (top >= 0).all() and (left >= 0).all() and (top + heights <= height).all() and (left + widths <= width).all()
    for measure in (
        lambda boxes: boxes[:, 2:].prod(dim=1).mean() / (height * width),  # the share of the area
        lambda boxes: (boxes[:, 3] / boxes[:, 2]).log().mean(),  # the aspect ratio
        lambda boxes: (boxes[:, 0] / (height - boxes[:, 2] + 1)).mean(),  # the position
    ):
        assert float(measure(ours)) == pytest.approx(float(measure(theirs)), abs=0.02)


def test_resized_crops_are_torchvisions_and_the_cpu_and_batched_ways_agree():
    torch.manual_seed(0)
    batch = torch.randint(0, 256, (32, 3, 23, 29), dtype=torch.uint8)
    boxes = crop_boxes(32, 23, 29, (0.08, 1.0), (3 / 4, 4 / 3), torch.device("cpu"))
    each = resize_each(batch, boxes, (20, 20))
    expected = torch.stack([TF.resized_crop(image, *box.tolist(), [20, 20], antialias=False)
                            for image, box in zip(batch, boxes)])  # fmt: skip
    assert each.dtype == torch.uint8 and torch.equal(each, expected)
    at_once = resize_batch(batch, boxes, (20, 20))  # the GPU's way, one grid_sample
    assert at_once.dtype == torch.uint8 and (at_once.int() - each.int()).abs().max() <= 1


def test_augment_with_crop_scale_gives_the_training_size_and_evaluation_the_centre():
    batch = torch.randint(0, 256, (16, 3, 23, 23), dtype=torch.uint8)
    torch.manual_seed(0)
    augmented = augment(batch, 0, hflip=True, size=(20, 20), crop_scale=(0.25, 1.0))
    assert augmented.shape == (16, 3, 20, 20) and augmented.dtype == torch.uint8
    assert torch.equal(center_crop(batch, (20, 20)), batch[:, :, 2:22, 2:22])  # torchvision's rounding
    assert not any(torch.equal(image, centre) for image, centre in zip(augmented, center_crop(batch, (20, 20))))
    assert torch.equal(augment(batch, 0, hflip=False, size=(20, 20)), center_crop(batch, (20, 20)))
    with pytest.raises(ValueError, match="smaller than the 24x24 to crop"):
        center_crop(batch, (24, 24))


def test_channel_stats_are_the_exact_mean_and_std_of_each_channel():
    batch = torch.randint(0, 256, (7, 3, 5, 6), dtype=torch.uint8)
    batch[:, 1] = 0  # a constant channel: std clamped, not zero
    mean, std = channel_stats(batch, chunk=3)
    pixels = batch.double().div(255).transpose(0, 1).reshape(3, -1)
    torch.testing.assert_close(mean, pixels.mean(dim=1).float())
    torch.testing.assert_close(std[[0, 2]], pixels[[0, 2]].std(dim=1, correction=0).float())
    assert std[1] == 1e-6
    float_mean, float_std = channel_stats(batch.float() / 255)  # [0, 1] floats, as normalize takes them: summed
    torch.testing.assert_close(float_mean, mean)
    torch.testing.assert_close(float_std, std)
