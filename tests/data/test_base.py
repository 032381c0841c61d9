import re
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from template.data import ImageDataModule


class Squares(ImageDataModule):
    """``images`` random images in every split; ``image_size`` set as a subclass sets it."""

    def __init__(self, images: int = 100, image_size=8, batch_size: int = 32) -> None:
        super().__init__(batch_size)
        self.images, self.num_classes, self.in_channels, self.class_names = images, 2, 3, ["a", "b"]
        self.image_size = image_size

    def load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        side = self.image_size
        return torch.randint(0, 256, (self.images, 3, *side), dtype=torch.uint8), torch.arange(self.images) % 2


@pytest.mark.parametrize(("size", "pair"), [(32, (32, 32)), ((16, 24), (16, 24)), ([16, 24], (16, 24))])
def test_image_size_takes_a_side_or_height_and_width(size, pair):
    data = Squares(image_size=size)
    assert data.image_size == pair and data.input_shape == (3, *pair)
    assert data.preprocessing()["input_shape"] == [3, *pair]


@pytest.mark.parametrize("size", [0, -4, (8,), (8, 8, 3), "32", True, 8.0, (8, 0)])
def test_an_image_size_that_is_no_side_or_pair_is_refused_naming_it(size):
    with pytest.raises(ValueError, match=rf"image_size must be a positive int .* not {re.escape(repr(size))}$"):
        Squares(image_size=size)


def test_a_source_that_sets_no_image_size_says_so():
    class NoSize(Squares):
        def __init__(self) -> None:
            ImageDataModule.__init__(self)

    with pytest.raises(AttributeError, match="NoSize sets no image_size"):
        _ = NoSize().image_size


def fake_trainer(world_size: int, rank: int) -> SimpleNamespace:
    cpu = SimpleNamespace(root_device=torch.device("cpu"))
    return SimpleNamespace(world_size=world_size, global_rank=rank, strategy=cpu)


def batch_sizes(images: int, batch_size: int, world_size: int = 1, rank: int = 0) -> list[int]:
    data = Squares(images, batch_size=batch_size)
    data.trainer = fake_trainer(world_size, rank)
    data.setup("fit")
    loader = data.train_dataloader()
    sizes = [len(labels) for _, labels in loader]
    assert len(loader) == len(sizes)  # what the Trainer (and the LR schedule) counts on
    return sizes


@pytest.mark.parametrize(
    ("images", "batch_size", "sizes"),
    [
        (100, 32, [32, 32, 32]),  # 4 left over: under half a batch, dropped
        (100, 64, [64, 36]),  # 36 left over: at least half a batch, kept (drop_last kept 64 of 100)
        (20, 32, [20]),  # a small set: one batch of what there is
        (96, 32, [32, 32, 32]),
    ],
)
def test_the_short_last_training_batch_is_dropped_only_under_half_a_batch(images, batch_size, sizes):
    assert batch_sizes(images, batch_size) == sizes


def test_every_ddp_rank_takes_the_same_steps_on_its_share():
    # 101 images on 2 ranks: 50 each (the sampler drops one), 32 + 18 kept on both.
    assert batch_sizes(101, 32, world_size=2, rank=0) == batch_sizes(101, 32, world_size=2, rank=1) == [32, 18]


def test_too_few_images_for_a_training_batch_are_refused():
    with pytest.raises(
        ValueError, match=r"has 10 images for 1 device\(s\), under half a batch each \(data.batch_size=32\)"
    ):
        batch_sizes(10, 32)


def test_a_mid_epoch_resume_keeps_the_short_last_batch():
    data = Squares(100, batch_size=64)
    data.setup("fit")
    loader = data.train_dataloader()
    order = list(loader.sampler)
    loader.sampler.consumed = 64  # the first batch was trained on when the checkpoint was taken
    resumed = Squares(100, batch_size=64)
    resumed.load_state_dict(data.state_dict())
    resumed.setup("fit")
    resumed_loader = resumed.train_dataloader()
    assert len(resumed_loader) == len(loader) == 2
    assert list(resumed_loader.sampler) == order[64:]
    assert [len(labels) for _, labels in resumed_loader] == [36]


def test_a_source_has_a_test_split_unless_it_says_otherwise():
    class NoTest(Squares):
        has_test = False

    assert Squares().has_test and not NoTest().has_test


@pytest.mark.parametrize(
    "convert, given",
    [(lambda images: images.float() / 255, "torch.float32"), (lambda images: images[:, 0], "torch.uint8, shape (100,")],
)
def test_images_other_than_uint8_n_c_h_w_from_load_split_are_refused_naming_it(convert, given):
    """Floats in [0, 1] would get statistics 255 times too small and train on inputs in the hundreds, silently."""

    class Floats(Squares):
        def load_split(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
            images, labels = super().load_split(split)
            return convert(images), labels

    with pytest.raises(ValueError, match=rf"Floats.load_split\('train'\) gave images of {re.escape(given)}") as error:
        Floats().setup("fit")
    assert "uint8 images (N, C, H, W)" in str(error.value) and ".round().to(torch.uint8)" in str(error.value)


@pytest.mark.parametrize(
    "convert, says",
    [
        (lambda images, labels: (images.numpy(), labels), r"gave images as ndarray, not a torch.Tensor \(torch.from"),
        (lambda images, labels: (images.permute(0, 2, 3, 1), labels), r"channels last: images.permute\(0, 3, 1, 2\)"),
        (lambda images, labels: (images, labels, None), "returned a tuple of 3: it returns two, \\(images, labels\\)"),
        (lambda images, labels: (images, labels.float()), "gave labels of torch.float32, shape \\(100,\\): it returns"),
        (lambda images, labels: (images, torch.eye(2)[labels]), r"one-hot or class probabilities \(N, K\)"),
        (lambda images, labels: (images, labels + 1), r"gave labels 1 to 2: class indices run from 0 to num_classes"),
    ],
    ids=["numpy", "channels-last", "three-values", "float-labels", "one-hot", "from-1"],
)
def test_a_load_split_that_returns_what_the_recipe_cannot_take_is_refused_naming_the_fix(convert, says):
    """Each trained silently wrong, or failed later naming no load_split: in an error of normalisation statistics,
    of unpacking, of an index in the splits, or of cross-entropy at the first validation."""

    class Mistaken(Squares):
        def load_split(self, split: str):
            return convert(*super().load_split(split))

    with pytest.raises(ValueError, match=rf"Mistaken.load_split\('train'\) .*{says}"):
        Mistaken().setup("fit")


def test_int32_labels_from_load_split_train_as_int64_and_predict_labels_go_unchecked():
    class Int32(Squares):
        def load_split(self, split: str):
            images, labels = super().load_split(split)
            return images, labels.int()

    data = Int32()
    data.setup("fit")
    assert data.datasets["train"].labels.dtype == torch.int64  # cross_entropy takes no int32 targets

    class Unlabelled(Squares):  # predict's labels are not used: -1 will do, as the README says
        def load_split(self, split: str):
            images, labels = super().load_split(split)
            return images, torch.full_like(labels, -1) if split == "predict" else labels

    Unlabelled().setup("predict")


def test_the_training_order_a_checkpoint_records_is_the_epoch_to_run_next_only_at_an_epochs_end():
    from template.data import DigitsDataModule
    from template.module import ClassificationModule
    from template.nets import ResNetSmall

    recorded = {}

    class Record(L.Callback):  # a checkpoint saved at an epoch's start, as a callback of yours may
        def on_train_epoch_start(self, trainer, pl_module):
            recorded[trainer.current_epoch] = trainer.datamodule.state_dict()["train_sampler"]

        def on_train_epoch_end(self, trainer, pl_module):
            recorded["end"] = trainer.datamodule.state_dict()["train_sampler"]

    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "accelerator": "cpu"}
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, callbacks=[Record()], **quiet)
    trainer.fit(ClassificationModule(ResNetSmall(10, 1)), DigitsDataModule())
    assert recorded[1] == {"epoch": 1, "samples_consumed": 0}  # epoch 1, about to run: not epoch 2
    assert recorded["end"] == {"epoch": 2, "samples_consumed": 0}  # epoch 1 run: a resume starts epoch 2
