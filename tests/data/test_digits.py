import numpy as np
import pytest
import torch
from conftest import FakeTrainer
from torch.utils.data import SequentialSampler

from template.data import DigitsDataModule, stratified_split
from template.data.loaders import ResumableSampler


def test_stratified_split_is_disjoint_complete_and_keeps_proportions():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), [400, 300, 200, 100])  # sorted and imbalanced: the worst case
    rng.shuffle(labels)
    train, val, test = stratified_split(labels, [0.15, 0.2], seed=3)
    assert not set(train) & set(val) and not set(train) & set(test) and not set(val) & set(test)
    assert sorted(np.concatenate([train, val, test])) == list(range(len(labels)))
    for part, share in ((train, 0.65), (val, 0.15), (test, 0.2)):
        counts = np.bincount(labels[part], minlength=4)
        expected = share * np.array([400, 300, 200, 100])
        assert np.all(np.abs(counts - expected) <= 1), (counts, expected)


def test_split_depends_on_its_seed_only():
    labels = np.repeat(np.arange(3), 50)
    a = stratified_split(labels, [0.2], seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, stratified_split(labels, [0.2], seed=0)))
    assert not np.array_equal(a[1], stratified_split(labels, [0.2], seed=1)[1])


def test_a_split_too_small_for_every_class_is_refused_clearly():
    with pytest.raises(ValueError, match="holds 2, fewer than the 4 classes"):
        stratified_split(np.repeat(np.arange(4), 10), [0.05], seed=0)


@pytest.mark.parametrize("fractions", [[0.5, 0.5], [0.0], [-0.1]])
def test_split_refuses_bad_fractions(fractions):
    with pytest.raises(ValueError, match="fractions"):
        stratified_split(np.zeros(10), fractions, seed=0)


def test_fit_never_loads_the_test_split():
    data = DigitsDataModule()
    data.setup("fit")
    assert set(data.datasets) == {"train", "val"}
    data.setup("test")
    assert set(data.datasets) == {"train", "val", "test"}
    sizes = {split: len(dataset) for split, dataset in data.datasets.items()}
    assert sum(sizes.values()) == 1797
    assert sizes["test"] == pytest.approx(0.2 * 1797, abs=1) and sizes["val"] == pytest.approx(0.15 * 1797, abs=1)


def test_loaders_shuffle_and_drop_last_on_train_only():
    data = DigitsDataModule(batch_size=32)
    data.setup("fit")
    train, val = data.train_dataloader(), data.val_dataloader()
    assert isinstance(train.sampler, ResumableSampler) and train.drop_last
    first_epoch = list(train.sampler)
    assert sorted(first_epoch) == list(range(len(data.datasets["train"])))  # a permutation
    assert first_epoch != sorted(first_epoch) and first_epoch == list(train.sampler)  # shuffled, by seed
    train.sampler.set_epoch(1)
    assert list(train.sampler) != first_epoch
    assert isinstance(val.sampler, SequentialSampler) and not val.drop_last
    assert not train.pin_memory and not train.persistent_workers  # CPU run, no workers
    images, labels = next(iter(train))
    assert images.shape == (32, 1, 8, 8) and images.dtype == torch.uint8 and images.max() > 200
    assert labels.dtype == torch.int64
    assert sum(len(batch[1]) for batch in val) == len(data.datasets["val"])


def test_persistent_workers_when_there_are_workers():
    data = DigitsDataModule(num_workers=1)
    data.setup("fit")
    assert data.train_dataloader().persistent_workers


def test_mid_epoch_state_skips_what_was_trained_and_keeps_the_epoch_length():
    data = DigitsDataModule(batch_size=32)
    data.setup("fit")
    loader = data.train_dataloader()
    loader.sampler.set_epoch(3)
    order = list(loader.sampler)
    loader.sampler.consumed = 5 * 32  # five batches trained when the checkpoint was taken
    state = data.state_dict()
    assert state["train_sampler"] == {"epoch": 3, "samples_consumed": 160}
    assert state["preprocessing"] == {"input_shape": [1, 8, 8], "resize": "none", "resize_size": [8, 8],
                                      "interpolation": "bilinear", "mean": data.mean.tolist(),
                                      "std": data.std.tolist()}  # fmt: skip

    resumed = DigitsDataModule(batch_size=32)
    resumed.load_state_dict(state)  # Lightning restores the DataModule before asking for loaders
    resumed.setup("fit")
    resumed_loader = resumed.train_dataloader()
    resumed_loader.sampler.set_epoch(3)  # the Trainer sets the same epoch again: the skip stays
    assert len(resumed_loader) == len(loader)
    assert [len(batch[1]) for batch in resumed_loader] == [32] * (len(loader) - 5)
    assert list(resumed_loader.sampler) == order[160:]
    resumed_loader.sampler.set_epoch(4)  # a new epoch starts from its beginning
    assert len(list(resumed_loader.sampler)) == len(order)


def test_batch_larger_than_the_train_split_is_refused():
    data = DigitsDataModule(batch_size=5000)
    data.setup("fit")
    with pytest.raises(ValueError, match="batch_size=5000"):
        data.train_dataloader()


def test_batch_hook_augments_in_training_and_only_normalises_otherwise():
    data = DigitsDataModule()
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    data.trainer = FakeTrainer(training=False)
    first, labels = data.on_after_batch_transfer(batch, 0)
    second, _ = data.on_after_batch_transfer(batch, 0)
    assert torch.equal(first, second) and torch.equal(labels, batch[1])
    assert first.dtype == torch.float32
    data.trainer = FakeTrainer(training=True)
    torch.manual_seed(0)
    augmented, _ = data.on_after_batch_transfer(batch, 0)
    assert augmented.shape == first.shape and not torch.equal(augmented, first)
    # Whole-split statistics: normalised training images have mean ~0 and std ~1.
    data.trainer = FakeTrainer(training=False)
    normalised, _ = data.on_after_batch_transfer((data.datasets["train"].images, data.datasets["train"].labels), 0)
    assert abs(normalised.mean().item()) < 1e-3 and normalised.std().item() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("crop_padding", [-1, 8])
def test_a_crop_padding_the_image_cannot_reflect_is_refused_before_loading(crop_padding):
    data = DigitsDataModule(crop_padding=crop_padding)
    with pytest.raises(ValueError, match=f"crop_padding={crop_padding} must be at least 0 and below the image side 8"):
        data.setup("fit")
    assert data.datasets == {}


@pytest.mark.parametrize(
    "augmentation",
    [{"policy": "trivialaugment"}, {"policy": "randaugment"}, {"random_erasing": 1.0}, {"mixup_alpha": 0.4},
     {"cutmix_alpha": 1.0}],
    ids=["trivialaugment", "randaugment", "random_erasing", "mixup", "cutmix"],
)  # fmt: skip
def test_each_policy_runs_on_one_channel_8x8_digits(augmentation):
    data = DigitsDataModule(batch_size=32, crop_padding=0, **augmentation)
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    data.trainer = type("Trainer", (), {"training": True})()
    torch.manual_seed(0)
    images, labels = data.on_after_batch_transfer(batch, 0)
    assert images.shape == (32, 1, 8, 8) and torch.isfinite(images).all()
    data.trainer.training = False
    assert not torch.equal(images, data.on_after_batch_transfer(batch, 0)[0])
    mixed = "mixup_alpha" in augmentation or "cutmix_alpha" in augmentation
    assert labels.shape == ((32, 10) if mixed else (32,))


@pytest.mark.parametrize(
    "sampler",
    [{"epoch": "3", "samples_consumed": 0}, {"epoch": 1}, {"epoch": 1, "samples_consumed": -5}, [1, 2]],
    ids=["epoch-text", "no-samples", "negative", "not-a-record"],
)
def test_a_damaged_training_order_in_a_checkpoint_is_named(sampler):
    with pytest.raises(ValueError, match="train_sampler state .* is damaged"):
        DigitsDataModule().load_state_dict({"train_sampler": sampler})


def test_a_training_order_past_the_epoch_is_refused_before_a_silent_empty_epoch():
    data = DigitsDataModule(batch_size=32)
    data.load_state_dict({"train_sampler": {"epoch": 0, "samples_consumed": 10**9}})
    data.setup("fit")
    with pytest.raises(ValueError, match="past the epoch's .* samples"):
        data.train_dataloader()


def test_a_class_too_small_for_every_split_is_named_never_left_out_in_silence():
    labels = np.array([0] * 30 + [1] * 30 + [2] * 3)
    with pytest.warns(UserWarning, match=r"the split of data.val_fraction holds no image of class 'eel'") as warned:
        stratified_split(labels, [0.1, 0.1], 0, ["val_fraction", "test_fraction"], ["cat", "dog", "eel"])
    assert any("data.test_fraction holds no image of class 'eel'" in str(each.message) for each in warned)
    with pytest.raises(ValueError, match=r"class 'eel' has 1 image: a split that keeps every class needs at least 2"):
        stratified_split(np.array([0] * 30 + [1] * 30 + [2]), [0.1], 0, ["val_fraction"], ["cat", "dog", "eel"])
