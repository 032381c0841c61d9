"""Any timm network by name (``pip install -e '.[timm]'``), its pretrained weights read offline, as tensors only.

    model:
      net:
        class_path: template.nets.timm_net
        init_args: {name: resnet18.a1_in1k, pretrained: true, drop_path_rate: 0.05}

The weights come from the Hugging Face or torch hub cache (found without a network) or ``pretrained_file``
(``--weights_file``); timm adapts them to the network (a new classifier, the first convolution summed for grey
images, its own key mapping).
"""

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

# Options that name a file or weights to load: only through `pretrained` and `pretrained_file`.
REFUSED = re.compile(
    r"pretrained|checkpoint|cache|file|path|dir|url|hub|num_classes|in_chans|features|pruned|kwargs", re.I
)


def import_timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ImportError("timm is not installed: pip install -e '.[timm]' (the dev extra has it too)") from None
    return timm


def checked(name: str) -> Any:
    """timm, once ``name`` is one of its models (``timm.list_models``), never a hub or folder address."""
    timm = import_timm()
    architecture = timm.models.split_model_name_tag(name)[0]
    if ":" in name or not timm.is_model(architecture):
        raise ValueError(f"model.net name {name!r} is not a timm model: see timm.list_models('{architecture[:4]}*')")
    return timm


def pretrained_config(name: str) -> Any:
    """timm's record of how ``name``'s weights were trained (mean, std, input size, crop fraction...)."""
    timm = checked(name)
    if (config := timm.get_pretrained_cfg(name)) is None:
        tags = timm.list_pretrained(f"{timm.models.split_model_name_tag(name)[0]}.*")
        raise ValueError(f"timm has no pretrained weights {name!r}; it has {', '.join(tags) or 'none for it'}")
    return config


def weights_location(config: Any) -> Path:
    """The file of ``config``'s weights in the Hugging Face or torch hub cache; nothing is downloaded."""
    from huggingface_hub import constants, try_to_load_from_cache

    from template.checkpoints import check_blob, check_hub_file

    looked = []
    if config.hf_hub_id:  # the environment as it is now (huggingface_hub reads it once, when imported)
        home = os.environ.get("HF_HOME")
        cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(home, "hub") if home else constants.HF_HUB_CACHE)
        # huggingface_hub reads the revision's ref whole: a file of holes there would take gigabytes of memory.
        ref = Path(cache, f"models--{config.hf_hub_id.replace('/', '--')}", "refs", "main")
        if ref.exists() and (not ref.is_file() or ref.stat().st_size > 256):
            raise ValueError(
                f"refusing {ref}: a Hugging Face ref names a commit in 40 characters, not a file like this"
            )
        for filename in (config.hf_hub_filename, "model.safetensors", "pytorch_model.bin"):
            found = filename and try_to_load_from_cache(config.hf_hub_id, filename, cache_dir=cache)
            if isinstance(found, str):
                return check_blob(Path(found), config.hf_hub_id)
        looked.append(f"{config.hf_hub_id} in the Hugging Face cache {cache}")
    if config.url:
        from template.nets.pretrained import hub_file

        if (path := hub_file(config.url)).is_file():
            return check_hub_file(path, config.url)
        looked.append(f"{path.name} in {path.parent}")
    get = f"`hf download {config.hf_hub_id}` on a machine online, then copy the cache" if config.hf_hub_id else "it"
    raise FileNotFoundError(
        f"no pretrained weights for timm {config.architecture} (tag {config.tag}): looked for {'; '.join(looked)}. "
        f"Fetch {get}, or give --weights_file PATH; nothing is downloaded during a run"
    )


def timm_net(
    name: str,
    num_classes: int = 1000,
    in_channels: int = 3,
    pretrained: bool = False,
    pretrained_file: str | None = None,
    drop_rate: float = 0.0,
    drop_path_rate: float | None = None,
    options: dict[str, int | float | bool | str | None] | None = None,
) -> nn.Module:
    """``timm.create_model(name, ...)`` with the data's class count and channels.

    Args:
        name: a timm model, with the tag of its weights (``resnet18.a1_in1k``; the default tag without one).
        pretrained: start from the weights (the caches or ``pretrained_file``); the data then takes their
            mean, std, input size and crop fraction unless given (``template.nets.pretrained``).
        pretrained_file: a state_dict file (safetensors or torch.save) read in place of the caches.
        drop_rate: dropout before the classifier; drop_path_rate: stochastic depth, for fine-tuning.
        options: timm's other options of the network (``global_pool: avg``...); no file or weights.
    """
    timm = checked(name)
    options = dict(options or {})
    if refused := [key for key in options if REFUSED.search(key)]:
        raise ValueError(
            f"model.net options {refused}: weights and files come only from pretrained and pretrained_file"
        )
    config = pretrained_config(name) if pretrained else None
    if drop_path_rate is not None:
        options["drop_path_rate"] = drop_path_rate
    settings = {"num_classes": num_classes, "in_chans": in_channels, "drop_rate": drop_rate, **options}
    if config is None:
        return create(timm, name, pretrained=False, **settings)
    from template.checkpoints import match_keys, read_weights, weights_limit

    with torch.device("meta"):  # what the weights must be, before any file is read (there, not here)
        expected = create(timm, name, pretrained=False, **settings)
    path = Path(pretrained_file) if pretrained_file else weights_location(config)
    state_dict, missing, _, mismatched = match_keys(expected, read_weights(path, weights_limit(expected)))
    # timm loads leniently for a new head: every other tensor must be there, with its shape, or the file is
    # another network's and the rest would stay untrained. timm adapts the classifier to another class count
    # and sums the first convolution over other channels.
    adapted = as_tuple(config.classifier) * (num_classes != config.num_classes)
    adapted += as_tuple(config.first_conv) * (in_channels != config.input_size[0])
    adapted = tuple(f"{prefix}." for prefix in adapted)
    missing = [key for key in missing if not key.endswith("num_batches_tracked")]  # timm's files hold none
    if wrong := [key for key in missing + mismatched if not key.startswith(adapted)]:
        raise ValueError(
            f"{path} is not the weights of timm {config.architecture}: {len(wrong)} of its tensors differ "
            f"({', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''}); give that network's weights"
        )
    # A file whose classifier fits the data (weights fine-tuned on it) keeps it: timm drops one of another class count.
    head = tuple(f"{prefix}." for prefix in as_tuple(config.classifier))
    fits = not any(key.startswith(head) for key in missing + mismatched)
    overlay = {"state_dict": state_dict, "source": None} | ({"num_classes": num_classes} if fits else {})
    net = create(timm, name, pretrained=True, pretrained_cfg_overlay=overlay, **settings)
    net.pretrained_cfg = {key: value for key, value in net.pretrained_cfg.items() if key != "state_dict"}
    new = "" if fits else f"; a new classifier for {num_classes} classes"
    print(f"timm {name}: pretrained weights from {path} ({len(state_dict)} tensors{new})")
    return net


def create(timm: Any, name: str, **settings: Any) -> nn.Module:
    """``timm.create_model``, its refusals of arguments (an unknown layer name, a keyword) as one line."""
    try:
        return timm.create_model(name, **settings)
    except (KeyError, AssertionError, TypeError, RuntimeError) as error:
        raise ValueError(f"timm {name} cannot be built with {settings}: {type(error).__name__}: {error}") from None


def as_tuple(value: Any) -> tuple:  # timm's classifier and first_conv: None, a name, or names
    return () if value is None else (value,) if isinstance(value, str) else tuple(value)
