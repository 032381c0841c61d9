"""``template export``: a trained network as safetensors, TorchScript or ONNX, checked for parity.

The network is rebuilt from the checkpoint's record and its weights loaded without unpickling. The file carries
``class_names`` and ``preprocessing`` as JSON strings (safetensors metadata, ONNX ``metadata_props``, TorchScript
extra files); it is read back and run beside the original, and fails if that metadata is lost or logits differ.
"""

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from template.checkpoints import (
    CHECKPOINT_ALIASES,
    CheckpointError,
    find_checkpoint,
    load_weights,
    machine_memory,
    read_checkpoint,
)
from template.cli import PROGRAM
from template.evaluation import multi_crop_logits
from template.files import replaced_atomically
from template.module import ClassificationModule
from template.restore import OWN_OPTIONS, build, restore
from template.runs import DEFAULT_RUNS_DIR
from template.text import printable, shown

FORMATS = {"safetensors": ".safetensors", "torchscript": ".torchscript.pt", "onnx": ".onnx"}
# The exported network as read back from its file, and the metadata the file carries.
Exported = tuple[Callable[[torch.Tensor], torch.Tensor], dict[str, str]]


def export_safetensors(net: nn.Module, path: Path, spec: dict, input_shape: list, metadata: dict[str, str]) -> Exported:
    from safetensors import safe_open
    from safetensors.torch import load_file, save

    # The network and input shape too: a reader rebuilds the network from them.
    metadata = {**metadata, "net": json.dumps(spec), "input_shape": json.dumps(input_shape)}
    # Not save_file: its temporary file makes the result mode 0600, where every other output follows the umask.
    path.write_bytes(save({k: v.contiguous() for k, v in net.state_dict().items()}, metadata=metadata))
    fresh = build(spec)  # the safetensors file must load into a network built anew
    fresh.load_state_dict(load_file(str(path)))
    fresh.eval()
    with safe_open(str(path), "pt") as file:
        return fresh, file.metadata()


def export_torchscript(net: nn.Module, path: Path, example: torch.Tensor, metadata: dict[str, str]) -> Exported:
    files = {f"{key}.json": value for key, value in metadata.items()}
    torch.jit.save(torch.jit.trace(net, example), str(path), _extra_files=files)
    carried = dict.fromkeys(files, "")  # torch.jit.load fills in the contents (bytes) of the files named
    loaded = torch.jit.load(str(path), _extra_files=carried)
    return loaded, {name.removesuffix(".json"): value.decode() for name, value in carried.items()}


def export_onnx(net: nn.Module, path: Path, example: torch.Tensor, metadata: dict[str, str]) -> Exported:
    try:
        import onnx
        import onnxruntime
    except ImportError as error:
        raise RuntimeError("ONNX export needs the export extra: pip install -e '.[export]'") from error
    batch = torch.export.Dim("batch", min=1)
    torch.onnx.export(net, (example,), str(path), dynamo=True, dynamic_shapes=({0: batch},), external_data=False)
    model = onnx.load(str(path))
    onnx.helper.set_model_props(model, {**{prop.key: prop.value for prop in model.metadata_props}, **metadata})
    onnx.save(model, str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def run(images: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: images.numpy()})[0])

    return run, session.get_modelmeta().custom_metadata_map


class MultiCrop(nn.Module):
    """The network as its module evaluates it (``test``, ``predict``): the mean logits of its test-time views."""

    def __init__(self, net: nn.Module, flip: bool, translate: int) -> None:
        super().__init__()
        self.net, self.flip, self.translate = net, flip, translate

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return multi_crop_logits(self.net, images, self.flip, self.translate)


PARITY_BATCH = 3  # images of the parity check: another count than the example's 2 (a dynamic batch dimension)


def check_memory(spec: dict, input_shape: list[int], source: Path) -> None:
    """Refuse an input shape whose example or parity batch would take over half this machine's memory in the
    network's activations: its largest output of a module for an image, thrice (with its input and a temporary),
    counted on the meta device (nothing allocated)."""
    outputs = []
    try:  # a network that reads values as it is built or runs (.item(), .tolist()): no estimate, the export tells
        with torch.device("meta"):
            meta = build(spec)
        for module in meta.modules():
            module.register_forward_hook(lambda m, i, out: outputs.append(out))
        with torch.no_grad():
            meta(torch.empty(1, *input_shape, device="meta"))
    except Exception:
        return
    largest = max((o.numel() * o.element_size() for o in outputs if isinstance(o, torch.Tensor)), default=0)
    needed = 3 * max(2, PARITY_BATCH) * largest  # the example's batch, then the parity batch's, a view at a time
    if needed > (memory := machine_memory()) // 2:
        raise ValueError(
            f"refusing {source}: its input_shape {input_shape} takes {needed / 2**30:,.1f} GiB of activations to "
            f"export and check, over half this machine's memory ({memory / 2**30:,.0f} GiB)"
        )


def export(
    ckpt_path: str | Path,
    fmt: str,
    output: str | Path | None = None,
    tolerance: float = 1e-4,
    own: set[str] = frozenset(),
    with_tta: bool = True,
) -> Path:
    """Export the network of a checkpoint; returns the path written. Raises if parity fails. ``own``: class paths
    of the user's own code the checkpoint may name (as ``--model`` names them to the other commands). ``with_tta``:
    its test-time augmentation with it (False: the bare network, one forward pass an image)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    restored = restore(ckpt_path, ClassificationModule, None, fit=False, own=own)  # names and literals: nothing run
    module_args, hparams = restored.config.get("model", {}).get("init_args", {}), restored.trained
    spec = module_args.get("net")
    if not isinstance(spec, dict):
        raise ValueError(
            f"{restored.path} does not say which network it holds (no net in its hyper-parameters); "
            "it was not written by this project's CLI"
        )
    if "weights" in spec["init_args"]:  # no pretrained weights: the checkpoint holds all of its own
        spec = {**spec, "init_args": {**spec["init_args"], "weights": None}}
    net = build(spec)
    net.eval()  # a train() override may not return the module
    load_weights(net, read_checkpoint(ckpt_path), strict=True)  # its tensors, checked against their digest
    if not hparams.get("input_shape"):
        raise ValueError("the checkpoint does not record its input shape (model.input_shape)")
    check_memory(spec, hparams["input_shape"], restored.path)
    path = Path(output) if output else Path(ckpt_path).with_suffix(FORMATS[fmt])
    if path.is_dir():
        raise ValueError(f"--output {path} is a folder: give the file to write, e.g. {path / ('net' + FORMATS[fmt])}")
    if other := next((name for name, suffix in FORMATS.items() if name != fmt and path.name.endswith(suffix)), None):
        raise ValueError(f"--output {path} is named as {other}, and this export writes {fmt}: name it *{FORMATS[fmt]}")
    # What a deployment needs beside the network; the defaults of the module for unnamed classes.
    class_names = hparams.get("class_names") or [str(index) for index in range(hparams["num_classes"])]
    metadata = {"class_names": json.dumps(class_names)}
    preprocessing = restored.preprocessing
    if preprocessing is None:
        warnings.warn(
            f"{ckpt_path} records no preprocessing (it was written before checkpoints did, or not by fit), "
            f"so {path.name} carries none: a deployment must be given the resize, mean and std of training "
            "by hand. To carry them in the file, export a checkpoint written by this version's fit.",
            stacklevel=2,
        )
    elif preprocessing["input_shape"] != list(hparams["input_shape"]):
        raise ValueError(
            f"the checkpoint contradicts itself: its model takes inputs {list(hparams['input_shape'])}, "
            f"its preprocessing record makes {preprocessing['input_shape']}; it was edited or damaged"
        )
    else:
        metadata["preprocessing"] = json.dumps(preprocessing)
    example = torch.randn(2, *hparams["input_shape"])
    # Test-time augmentation as the module evaluates: in a TorchScript or ONNX graph, in a safetensors file's metadata.
    tta = {"flip": module_args.get("flip_tta") is True, "translate": module_args.get("tta_translate") or 0}
    tta = tta if with_tta else {}
    evaluated = MultiCrop(net, **tta) if any(tta.values()) and fmt != "safetensors" else net
    metadata |= {"tta": json.dumps(tta)} if any(tta.values()) and fmt == "safetensors" else {}  # the graphs apply it
    with replaced_atomically(path) as written:  # checked before it takes the name: a failed export leaves no file
        if fmt == "safetensors":
            exported, carried = export_safetensors(net, written, spec, list(hparams["input_shape"]), metadata)
        elif fmt == "torchscript":
            exported, carried = export_torchscript(evaluated, written, example, metadata)
        else:
            exported, carried = export_onnx(evaluated, written, example, metadata)
        if lost := [key for key, value in metadata.items() if carried.get(key) != value]:
            raise RuntimeError(f"the {fmt} file {path} does not read back its metadata {', '.join(lost)}")
        # Parity on a fresh batch of another size than the example (dynamic batch dimension).
        batch = torch.randn(PARITY_BATCH, *hparams["input_shape"], generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            difference = (exported(batch).float() - evaluated(batch).float()).abs().max().item()
        print(
            f"parity: max |exported - original| = {difference:.3g} on a batch of {len(batch)} (tolerance {tolerance:g})"
        )
        if not difference <= tolerance:
            raise RuntimeError(f"the {fmt} export differs from the original by {difference:.3g} > {tolerance:g}")
    kept = "in its metadata (tta): a reader applies it" if fmt == "safetensors" else "in the graph, as predict runs it"
    print(
        f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB)"
        + f"; test-time augmentation {tta} {kept}" * any(tta.values())
    )
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"{PROGRAM} export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file, or best / last of --runs_dir's latest run")
    parser.add_argument("--runs_dir", default=DEFAULT_RUNS_DIR, help="where best and last are looked for")
    parser.add_argument("--format", required=True, choices=list(FORMATS), dest="fmt")
    parser.add_argument("--output", help="where to write (default: beside the checkpoint)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed logit difference")
    parser.add_argument("--no_tta", action="store_true", help="the bare network: no flip_tta, tta_translate")
    for option in OWN_OPTIONS.values():
        parser.add_argument(option, help="a class of your own the checkpoint names, as fit named it")
    return parser


def main(args: list[str]) -> None:
    parser = build_parser()
    options = parser.parse_args(args)
    ckpt_path = options.ckpt_path
    try:
        if ckpt_path in CHECKPOINT_ALIASES:
            ckpt_path = find_checkpoint(ckpt_path, options.runs_dir)
            print(shown(f"--ckpt_path {options.ckpt_path} -> {ckpt_path}", markup=False))
        own = {getattr(options, option[2:]) for option in OWN_OPTIONS.values()} - {None}
        export(ckpt_path, options.fmt, options.output, options.tolerance, own, with_tta=not options.no_tta)
    except (CheckpointError, ValueError, RuntimeError, FileNotFoundError) as error:
        print(f"{parser.prog}: error: {printable(str(error))}", file=sys.stderr)  # a file's text: no escapes run
        raise SystemExit(1) from None
