"""configs/augment/*.yaml: each preset reaches whichever DataModule the data config before it chose."""

from pathlib import Path

import pytest
import yaml
from conftest import write_image_folder

from template.cli import cli
from template.data import DigitsDataModule, ImageFolderDataModule

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "configs" / "augment").glob("*.yaml"))


def test_there_are_light_and_strong_presets():
    assert [preset.stem for preset in PRESETS] == ["light", "strong"]


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.stem)
@pytest.mark.parametrize("data", ["digits", "imagefolder"])
def test_augmentation_preset_composes_after_a_data_config(preset, data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    settings = yaml.safe_load(preset.read_text())
    assert list(settings) == ["data"] and list(settings["data"]) == ["init_args"]  # any DataModule's, no class
    args = ["--trainer.accelerator", "cpu", "--config", str(preset)]
    if data == "imagefolder":
        images = write_image_folder(tmp_path / "images", classes=("cat", "dog"), per_class=4, size=(8, 8))
        args = ["--config", str(REPO / "configs/imagefolder.yaml"), "--data.root", str(images), *args]
    datamodule = cli(args, run=False).datamodule
    assert type(datamodule) is (DigitsDataModule if data == "digits" else ImageFolderDataModule)
    for key, value in settings["data"]["init_args"].items():
        assert getattr(datamodule, key) == value, key
