"""``template doctor [fit options]``: pre-flight checks of what ``fit`` would build, in seconds: the environment,
the data, the model, whether the configured module (``short_fit.py``) memorises a few images, its memory and
speed. Each check says pass / warn / fail, what it saw and what to do; any fail exits with status 1."""

import copy
import hashlib
import importlib.metadata
import itertools
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.model_summary import ModelSummary
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from torch import nn

from template.cli import PROGRAM, cli
from template.data.base import ImageDataModule
from template.data.loaders import TensorImageDataset
from template.module import ClassificationModule
from template.text import printable
from template.tools.short_fit import MeasureSteps, Memorise, short_fit

STACK = ("torch", "torchvision", "lightning", "torchmetrics", "jsonargparse")
STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}
OVERFIT_IMAGES = 16  # the few images the module must memorise


@dataclass
class Check:
    group: str
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""


def check_environment(accelerator: str) -> list[Check]:
    """Versions, and whether the GPU this torch build was made for can be used."""
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in STACK)
    stack = Check("environment", "python and stack", "pass", f"python {platform.python_version()}, {versions}")
    # Asking for a GPU that cannot be used fails; running on the CPU when none is asked for does not.
    bad, no_gpu = ("fail", "fail") if accelerator in ("gpu", "cuda") else ("warn", "pass")
    built = f"torch is built for CUDA {torch.version.cuda} but torch.cuda.is_available() is False"
    if torch.version.cuda is None:
        status, detail = no_gpu, "CPU-only build of torch"
        fix = "install a CUDA build of torch (pytorch.org lists the one for your driver)"
    elif torch.cuda.is_available():
        names, unsupported, arch_list = [], [], torch.cuda.get_arch_list()
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            names.append(f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})")
            # Kernels compiled for its architecture, or as PTX for an older one that the driver compiles.
            ptx = any(arch.startswith("compute_") and int(arch[8:]) <= major * 10 + minor for arch in arch_list)
            if arch_list and f"sm_{major}{minor}" not in arch_list and not ptx:
                unsupported.append(names[-1])
        detail = f"CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}: {', '.join(names)}"
        status, fix = "pass", "install a torch build that lists the device's architecture"
        if unsupported:
            status = "fail"
            detail += f"; this build has no kernels for {', '.join(unsupported)} (it has {' '.join(arch_list)})"
    elif os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        status, detail = bad, f"{built}: CUDA_VISIBLE_DEVICES hides every GPU"
        fix = "unset CUDA_VISIBLE_DEVICES or name the GPUs to use"
    elif shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists():
        status = bad
        detail = f"{built}: an NVIDIA device is here, its driver missing, unloaded or older than this CUDA needs"
        fix = "nvidia-smi shows the newest CUDA the driver supports: update the driver, or install a torch for it"
    else:
        status, detail = no_gpu, f"{built}: this machine has no NVIDIA GPU, so training runs on the CPU"
        fix = "run on a GPU machine"
    return [stack, Check("environment", "cuda", status, detail, "" if status == "pass" else fix)]


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def split_contents(dataset) -> tuple[list[str], torch.Tensor]:
    """A content hash of every image of a split (files hashed as stored), and its labels."""
    if isinstance(dataset, TensorImageDataset):
        return [digest(np.asarray(image).tobytes()) for image in dataset.images], torch.as_tensor(dataset.labels)
    if hasattr(dataset, "files") and hasattr(dataset, "labels"):  # streamed image files
        return [digest(Path(file).read_bytes()) for file in dataset.files], torch.as_tensor(dataset.labels)
    items = [dataset[index] for index in range(len(dataset))]
    keys = [digest(np.asarray(image).tobytes()) for image, _ in items]
    return keys, torch.as_tensor([int(label) for _, label in items])


def image_names(datamodule: ImageDataModule, split: str, count: int) -> list[str]:
    """Each image of a split by its file, else its position (and index in the source, where recorded)."""
    files = getattr(datamodule, "split_files", {}).get(split)
    if files is not None and len(files) == count:
        return [str(file) for file in files]
    indices = getattr(datamodule, "split_indices", {}).get(split)
    if indices is not None and len(indices) == count:
        return [f"{split}[{position}] (source image {index})" for position, index in enumerate(indices)]
    return [f"{split}[{position}]" for position in range(count)]


def check_splits(datamodule: ImageDataModule) -> list[Check]:
    """Labels in range, class balance, and images shared between train, val and test."""
    num_classes = datamodule.num_classes
    splits = [split for split in ("train", "val", "test") if split in datamodule.datasets]
    contents = {split: split_contents(datamodule.datasets[split]) for split in splits}
    wrong = []
    for split, (_, labels) in contents.items():
        if labels.is_floating_point():
            wrong.append(f"{split} labels are {labels.dtype}, not integer class indices")
        elif len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
            outside = labels[(labels < 0) | (labels >= num_classes)]
            wrong.append(f"{split}: {len(outside)} label(s) outside [0, {num_classes}), e.g. {outside[0].item()}")
    if wrong:  # counting classes needs labels in range
        fix = "labels must be int64 indices 0..num_classes-1; check num_classes and the label mapping"
        return [Check("data", "labels", "fail", "; ".join(wrong), fix)]
    checks = [Check("data", "labels", "pass", f"integer labels in [0, {num_classes}) in every split")]
    counts = {split: torch.bincount(labels, minlength=num_classes) for split, (_, labels) in contents.items()}
    sizes = " / ".join(f"{split} {int(count.sum())}" for split, count in counts.items())
    names = getattr(datamodule, "class_names", None) or []  # the classes by name, as the folders or the data say
    names = names if len(names) == num_classes else list(map(str, range(num_classes)))
    missing = {split: [names[i] for i in (count == 0).nonzero().flatten().tolist()] for split, count in counts.items()}
    train = counts["train"]
    if missing["train"]:
        status, detail = "fail", f"classes {missing['train']} have no training image"
        fix = "add training images for them, or drop the classes"
    elif any(missing.get(split) for split in ("val", "test")):
        status, detail = "warn", f"classes missing from val {missing.get('val')} / test {missing.get('test')}"
        fix = "use a stratified split (as the built-in sources do) or more held-out images"
    elif train.max() > 10 * train.min():
        most, least = names[int(train.argmax())], names[int(train.argmin())]
        status, detail = "warn", f"train has {int(train.max())} images of {most!r} and {int(train.min())} of {least!r}"
        fix = "read each class's accuracy (val/confusion_matrix in TensorBoard); weigh the loss in a subclass of the module"
    else:
        status, detail, fix = "pass", f"per class in train {int(train.min())}-{int(train.max())}", ""
    checks.append(Check("data", "class balance", status, f"{sizes} images; {detail}", fix))
    for first, second in itertools.combinations(contents, 2):  # train/val, train/test, val/test
        seen = {key: index for index, key in enumerate(contents[first][0])}
        shared = [(seen[key], index) for index, key in enumerate(contents[second][0]) if key in seen]
        name = f"{first}/{second} overlap"
        if shared:
            names = {split: image_names(datamodule, split, len(contents[split][0])) for split in (first, second)}
            examples = "; ".join(f"{names[second][j]} = {names[first][i]}" for i, j in shared[:3])
            checks.append(Check("data", name, "fail", f"{len(shared)} {second} image(s) also in {first}: {examples}",
                                f"remove the duplicates: {second} accuracy measured on images trained on is inflated"))  # fmt: skip
        else:
            checks.append(Check("data", name, "pass", f"no {second} image is also in {first} (content hash)"))
    return checks


def check_batches(datamodule: ImageDataModule, batches: int = 3) -> tuple[Check, tuple | None]:
    """Dtype, finiteness and range of a few training batches, before and after normalisation."""
    problems, warnings, first, sizes = [], [], None, []
    for index, (images, labels) in zip(range(batches), datamodule.train_dataloader()):
        sizes.append(len(images))
        if not (images.dtype == torch.uint8 or images.is_floating_point()):
            problems.append(f"batch {index}: images are {images.dtype}; expected uint8 or float")
            continue
        if images.is_floating_point() and not torch.isfinite(images).all():
            problems.append(f"batch {index}: {int((~torch.isfinite(images)).sum())} NaN/Inf pixel(s) as loaded")
        normalised, labels = datamodule.on_after_batch_transfer((images, labels), 0)
        if not torch.isfinite(normalised).all():
            problems.append(f"batch {index}: NaN/Inf after normalisation (mean {datamodule.mean.tolist()}, "
                            f"std {datamodule.std.tolist()})")  # fmt: skip
        elif normalised.abs().max() > 50:
            warnings.append(f"batch {index}: normalised values reach {normalised.abs().max():.0f}")
        first = first or (normalised, labels)
    if problems:
        fix = "find the bad files or values (corrupt images, divide by zero) and fix or drop them"
        return Check("data", "batches", "fail", "; ".join(problems), fix), first
    if warnings:
        return Check("data", "batches", "warn", "; ".join(warnings), "check the mean and std used to normalise"), first
    seen = f"{len(sizes)} batch(es) of {', '.join(map(str, sorted(set(sizes))))} images"  # an epoch may have fewer
    detail = f"{seen}: finite, normalised to [{normalised.min():.1f}, {normalised.max():.1f}]"
    return Check("data", "batches", "pass", detail), first


def autograd_leaves(output: torch.Tensor) -> list[torch.Tensor]:
    """The tensors requiring grad that ``output`` was computed from."""
    leaves, seen, stack = [], set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad: where a leaf's gradient lands
            leaves.append(node.variable)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return leaves


def plain_containers(net: nn.Module) -> list[str]:
    """Attributes holding modules or trainable tensors in a plain list, tuple or dict."""
    found = []
    for prefix, module in net.named_modules():
        for attr, value in vars(module).items():
            values = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else []
            if any(isinstance(v, nn.Module) or (torch.is_tensor(v) and v.requires_grad) for v in values):
                found.append(f"{prefix}.{attr}" if prefix else attr)
    return found


def check_model(net: nn.Module, images: torch.Tensor, labels: torch.Tensor, num_classes: int) -> list[Check]:
    """Raw logits out, a gradient into every parameter, nothing trainable left unregistered."""
    net = copy.deepcopy(net).train()
    try:
        logits = net(images)
    except Exception as error:  # reported as the failed check, with the network's own message
        return [Check("model", "forward", "fail", f"{type(error).__name__}: {error}", "fix the network's forward")]
    if logits.shape != (len(images), num_classes):
        return [Check("model", "output shape", "fail", f"{tuple(logits.shape)} for {len(images)} images",
                      f"the network must return (batch, {num_classes}) logits")]  # fmt: skip
    rows = logits.detach().double()
    if rows.min() >= 0 and rows.max() <= 1 and torch.allclose(rows.sum(1), torch.ones_like(rows[:, 0]), atol=1e-3):
        checks = [Check("model", "raw logits", "fail", "outputs are probabilities (each row in [0, 1], summing "
                        "to 1): a softmax before cross_entropy flattens the gradients",
                        "return raw logits from forward: cross_entropy applies log-softmax itself")]  # fmt: skip
    else:
        checks = [Check("model", "raw logits", "pass", f"outputs span [{rows.min():.2f}, {rows.max():.2f}]")]
    registered = {id(parameter) for parameter in net.parameters()}
    stray = [leaf for leaf in autograd_leaves(logits) if id(leaf) not in registered]
    try:
        F.cross_entropy(logits, labels).backward()
    except RuntimeError as error:  # e.g. an in-place op overwrote a tensor autograd saved
        checks.append(Check("model", "backward", "fail", str(error).splitlines()[0],
                            "replace the in-place op (x += ..., relu(inplace=True) on a saved tensor) by x = x + ..."))  # fmt: skip
        return checks
    if stray:
        where = ", ".join(plain_containers(net)) or "tensors created in forward"
        checks.append(Check("model", "registered parameters", "fail", f"{len(stray)} trainable tensor(s) "
                            f"({sum(t.numel() for t in stray):,} weights) outside the module tree, in: {where}; "
                            "the optimizer never updates them and checkpoints never save them",
                            "hold layers in nn.ModuleList / nn.ModuleDict and tensors in nn.Parameter"))  # fmt: skip
    else:
        checks.append(Check("model", "registered parameters", "pass", "every trainable tensor is a parameter"))
    unused = [name for name, p in net.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        checks.append(Check("model", "gradients", "fail", f"no gradient reaches {len(unused)} parameter(s): "
                            f"{', '.join(unused[:5])}", "use the layer in forward or remove it (and no .detach())"))  # fmt: skip
    else:
        checks.append(Check("model", "gradients", "pass", "a gradient reaches every parameter"))
    return checks


def check_learnability(model: ClassificationModule, trainer: L.Trainer, images: torch.Tensor, labels: torch.Tensor,
                       steps: int = 200) -> Check:  # fmt: skip
    """Can the configured module memorise a few images? If not, nothing else matters."""
    try:
        result = short_fit(model, trainer, (images, labels), steps, Memorise(labels))
    except Exception as error:  # reported as the failed check, in the module's own words
        return Check("learnability", "training step", "fail", f"{type(error).__name__}: {error}",
                     "fix the module's training_step or configure_optimizers")  # fmt: skip
    losses, name = result.losses, "overfit one batch"
    trend = f"the module's loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    if result.memorised:
        return Check("learnability", name, "pass", f"{len(images)} images memorised: {trend} in {len(losses)} steps")
    return Check("learnability", name, "fail", f"{len(images)} images not memorised in {steps} steps: {trend}",
                 "check the learning rate, that the loss sees the network's output, and that labels match images")  # fmt: skip


def check_memory_and_speed(model: ClassificationModule, trainer: L.Trainer, images: torch.Tensor,
                           labels: torch.Tensor, batch_size: int, seconds: float = 1.0) -> list[Check]:  # fmt: skip
    """Memory of one training step at the configured batch, and images/s of a short timed fit."""
    device = trainer.strategy.root_device
    repeats = -(-batch_size // len(images))
    batch = images.repeat(repeats, 1, 1, 1)[:batch_size], labels.repeat(repeats)[:batch_size]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        measured = short_fit(model, trainer, batch, 1000, MeasureSteps(seconds))
    except torch.OutOfMemoryError as error:
        return [Check("resources", "memory", "fail", str(error).splitlines()[0],
                      "lower data.batch_size, use bf16-mixed or model.net.checkpoint_stages")]  # fmt: skip
    mb, memory = 2**20, measured.memory
    detail = (f"batch {batch_size}: parameters {memory['parameters'] / mb:.1f} MB, gradients "
              f"{memory['gradients'] / mb:.1f} MB, optimizer {memory['optimizer'] / mb:.1f} MB, activations "
              f"~{memory['activations'] / mb:.1f} MB (layer outputs)")  # fmt: skip
    if device.type == "cuda":
        detail += (f"; CUDA peak allocated {torch.cuda.max_memory_allocated(device) / mb:.0f} MB, "
                   f"reserved {torch.cuda.max_memory_reserved(device) / mb:.0f} MB")  # fmt: skip
    rate = measured.timed_steps * batch_size / measured.elapsed
    throughput = (f"{rate:,.0f} images/s training ({trainer.precision}, {device}, {measured.timed_steps} steps "
                  f"of {batch_size} through the module's training_step; data loading not included)")  # fmt: skip
    return [Check("resources", "memory", "pass", detail), Check("resources", "throughput", "pass", throughput)]


def run_checks(
    model: ClassificationModule, datamodule: ImageDataModule, trainer: L.Trainer, accelerator: str = "auto"
) -> tuple[list[Check], ModelSummary | None]:
    """Every check, in order, and the module's summary (each layer's output shape) once a clean batch is at hand;
    ``accelerator`` is the one asked for ("auto", "gpu"...), not the one Lightning chose."""
    checks = check_environment(accelerator)
    try:
        batch_size = datamodule.device_batch_size(trainer.world_size, trainer.accumulate_grad_batches)
    except ValueError as error:
        fix = f"change data.{datamodule.global_option()[0]}"  # the global batch's: batch_size where it shares that
        return [*checks, Check("data", "batch size", "fail", str(error), fix)], None
    for stage in ("fit", "test"):
        try:
            datamodule.setup(stage)
        except (FileNotFoundError, ValueError) as error:  # a missing folder, unreadable files: the data's own words
            status = "fail" if stage == "fit" else "warn"
            checks.append(Check("data", f"{stage} splits", status, str(error), "see the message"))
            if stage == "fit":
                return checks, None
    checks += check_splits(datamodule)
    batches, first = check_batches(datamodule)
    checks.append(batches)
    if first is None or any(check.status == "fail" for check in checks if check.group == "data"):
        return checks, None  # the model checks need a clean batch
    images, labels = first
    few = images[:OVERFIT_IMAGES], labels[:OVERFIT_IMAGES]
    checks += check_model(model.net, *few, datamodule.num_classes)
    if any(check.status == "fail" for check in checks if check.group == "model"):
        return checks, None
    checks.append(check_learnability(model, trainer, *few))
    if checks[-1].name != "training step":  # a step that raises cannot be timed either
        checks += check_memory_and_speed(model, trainer, images, labels, batch_size)
    model = copy.deepcopy(model)
    model.example_input_array = images[:1]  # what Lightning's summary runs to find each layer's output shape
    return checks, ModelSummary(model, max_depth=3)  # down to the network's stages


def main(args: list[str]) -> None:
    built = cli(args, run=False, command="doctor")
    accelerator = str(built.config.get("trainer", {}).get("accelerator", "auto"))
    checks, summary = run_checks(built.model, built.datamodule, built.trainer, accelerator)
    if summary is not None:
        print(summary)
    columns = 4 if any(check.fix for check in checks) else 3  # a fix column only when there is one to show
    # A file's path folded over lines, never cut short: which files clash is the point.
    headers = ("check", "status", "what it saw", "fix")[:columns]
    table = Table(*(Column(header, overflow="fold") for header in headers), title=f"{PROGRAM} doctor")
    for check in checks:  # what a check saw may quote the data's file names: as text, never markup or escapes
        texts = [escape(printable(text)) for text in (check.detail, check.fix)]
        cells = [f"{check.group}: {check.name}", f"[{STYLE[check.status]}]{check.status}[/]", *texts]
        table.add_row(*cells[:columns])
    console = Console()
    console.print(table)
    failed = [f"{check.group}/{check.name}" for check in checks if check.status == "fail"]
    if failed:
        console.print(f"[bold red]failed: {', '.join(failed)}[/]")
        raise SystemExit(1)
    warned = sum(check.status == "warn" for check in checks)
    console.print(f"[green]no check failed[/] ({warned} warning(s))" if warned else "[green]every check passed[/]")
