import pickle

import numpy as np
import pytest

from template.data import CIFAR10DataModule
from template.data.cifar10 import CLASS_NAMES, FOLDER, TEST_FILES, TRAIN_FILES


def write_cifar(root, per_file=20):
    """The python-pickle layout of CIFAR-10, as the original release ships it, with tiny batches."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number, name in enumerate(TRAIN_FILES + TEST_FILES):
        labels = [(number + i) % 10 for i in range(per_file)]
        batch = {"batch_label": name, "labels": labels, "data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8)}
        with (folder / name).open("wb") as file:
            pickle.dump(batch, file)
    with (folder / "batches.meta").open("wb") as file:
        pickle.dump({"label_names": CLASS_NAMES}, file)
    return root


def test_reads_the_pickle_layout(tmp_path):
    data = CIFAR10DataModule(root=str(write_cifar(tmp_path)), batch_size=8, val_fraction=0.2)
    data.setup("fit")
    assert len(data.datasets["train"]) == 80 and len(data.datasets["val"]) == 20  # 5 files of 20
    images, labels = next(iter(data.train_dataloader()))
    assert images.shape == (8, 3, 32, 32) and str(images.dtype) == "torch.uint8"
    data.setup("test")
    assert len(data.datasets["test"]) == 20
    assert data.class_names[0] == "airplane" and data.num_classes == 10


def test_missing_files_say_where_it_looked_and_how_to_get_them(tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"CIFAR-10 not found: looked for data_batch_1.*cifar-10-batches-py.*download"
    ):
        CIFAR10DataModule(root=str(tmp_path)).prepare_data()


def test_a_doctored_batch_file_is_refused_not_run(tmp_path):
    root = write_cifar(tmp_path)
    marker = tmp_path / "code-ran"
    payload = type("Payload", (), {"__reduce__": lambda self: (__import__("os").system, (f"touch {marker}",))})
    with (root / FOLDER / "test_batch").open("wb") as file:
        pickle.dump({"data": payload(), "labels": []}, file)
    data = CIFAR10DataModule(root=str(root))
    with pytest.raises(pickle.UnpicklingError, match="refusing to load posix.system"):
        data.setup("test")
    assert not marker.exists()
