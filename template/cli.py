"""The command line: ``template fit | validate | test | predict`` through LightningCLI.

Everything a run is configured by is a typed ``__init__`` signature (network, module,
DataModule, Trainer) plus YAML in ``configs/``; LightningCLI turns them into options,
so a misspelt key or a wrongly typed value fails before any training starts.
"""

import logging
import os
import re
import sys
import warnings
from pathlib import Path

import torch
import yaml
from jsonargparse import ArgumentParser, Namespace
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from rich.console import Console

from template.callbacks import (
    NonFiniteGuard,
    PredictionWriter,
    ResumeState,
    RunRecord,
    TrainingMonitor,
)
from template.callbacks.run_record import run_directory
from template.checkpoints import (
    CHECKPOINT_ALIASES,
    AtomicCheckpointIO,
    CheckpointError,
    find_checkpoint,
    load_pretrained,
)
from template.data import ImageDataModule
from template.module import ClassificationModule
from template.nets.pretrained import check_cached, head_name, weights_of
from template.nets.shape import check_fits, network_arguments
from template.options import (
    condense,
    names_checkpoint,
    nearest_option,
    switched_to_own_defaults,
    without_data_options,
)
from template.restore import Restored, class_paths, restore
from template.runs import (
    continue_tracker_runs,
    is_tensorboard,
    loggers_of,
    runs_dir,
)
from template.tracking import resolve_trackers, where_to_look

PROGRAM = __package__  # the command's name is the package's: `template fit`, `python -m template`
# Commands besides fit / validate / test / predict, each a module with main(args).
EXTRA_COMMANDS = {
    "doctor": f"{PROGRAM}.tools.doctor",
    "lr-find": f"{PROGRAM}.tools.lr_find",
    "export": f"{PROGRAM}.tools.export",
    "sweep": f"{PROGRAM}.tools.sweep",
    "cv": f"{PROGRAM}.tools.cv",
}

# The recipe's defaults, written once: loaded before any --config file or option.
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"
SUBCOMMANDS = ("fit", "validate", "test", "predict")


class HideTips(logging.Filter):
    """Lightning's "💡 Tip" lines advertise its other products: not what a run reports."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(HideTips())


# Set to 1 for the full traceback of an error, and jsonargparse's full text of a parse error.
TRACEBACK_VARIABLE = "TRACEBACK"


def wants_traceback() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")


# Callbacks every run has, each configured by a section of its own: --checkpoint.monitor...
CALLBACKS = {
    "checkpoint": ModelCheckpoint,  # the best by validation
    "last_checkpoint": ModelCheckpoint,
    "lr_monitor": LearningRateMonitor,
    "predictions": PredictionWriter,
    "nonfinite": NonFiniteGuard,
    "monitor": TrainingMonitor,
}


class ConciseArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose errors say what is wrong in a line or two: the option, and the
    innermost reason jsonargparse found, instead of its tree of every Union member tried (set
    TRACEBACK=1 for the whole of it) and a usage listing of every option (``--help`` has those)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})  # --trainer.max_epoch is not max_epochs

    def error(self, message: str, ex: Exception | None = None):
        if not wants_traceback():
            message = nearest_option(condense(message), [o for a in self._actions for o in a.option_strings])
        super().error(message, ex)

    def print_usage(self, file=None) -> None:
        (file or sys.stdout).write(f"usage: {self.prog.replace(' [options]', '')} [options]\n")


class ClassificationCLI(LightningCLI):
    """LightningCLI with this project's defaults, argument links and run summary."""

    # (name, version) of the run directory under the TensorBoard logger's save_dir, when a
    # command running many fits places them (template sweep, template cv); else the logger's own.
    run_name: tuple[str, str] | None = None

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The best checkpoint, last.ckpt and the other callbacks; their settings, like every default,
        # are in DEFAULT_CONFIG.
        for section, callback in CALLBACKS.items():
            parser.add_lightning_class_args(callback, section)
        # The DataModule knows the classes, channels and image size; the model is told,
        # so they are never stated twice.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.init_args.class_names", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.init_args.input_shape", apply_on="instantiate")
        # The network's num_classes and in_channels, where it takes them: instantiate_classes.
        parser.add_argument(
            "--weights_file",
            type=str | None,
            default=None,
            help="A state_dict file (.pt, .pth, .safetensors, or a .ckpt) the network starts from, its head new when "
            "the class count differs. With a torchvision model.net.weights name too, it is those weights, read from "
            "this file instead of the hub cache (their normalisation and input size apply).",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse as LightningCLI does. With ``--ckpt_path``, the checkpoint read as data (``template.restore``:
        registry names and literal values, never a path or a setting of the Trainer, logger or callbacks)
        is the first --config after the recipe's defaults, which every --config file and option given
        overrides. Lightning's own reading of a checkpoint's hyper-parameters never sees it."""
        self.restored: Restored | None = None
        # Printed here, after the changes below, not by jsonargparse in the middle of parsing: what runs.
        printing = [token for token in args if token.split("=")[0] == "--print_config"]
        args = [token for token in args if token not in printing]
        ckpt_given = names_checkpoint(args)
        # --data options may be for the checkpoint's DataModule, not yet known: left out until it is.
        super().parse_arguments(parser, without_data_options(args) if ckpt_given else args)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path:
            config = self.config[subcommand]
            try:
                if ckpt_path in CHECKPOINT_ALIASES:
                    ckpt_path = find_checkpoint(ckpt_path, runs_dir(config))
                    if rank_zero_only.rank == 0:
                        print(f"--ckpt_path {config.ckpt_path} -> {ckpt_path}")
                if not Path(ckpt_path).is_file():
                    raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no such file")
                own = class_paths(config.as_dict()) | {v for k, v in zip(args, args[1:]) if k == "--data"}
                self.restored = restore(ckpt_path, self.model_class, runs_dir(config), subcommand == "fit", own)
            except (CheckpointError, FileNotFoundError) as error:
                parser.error(str(error))
            at = args.index(subcommand) + 1  # after the recipe's defaults: every option given overrides it
            at += 2 if args[at : at + 2] == ["--config", str(DEFAULT_CONFIG)] else 0
            super().parse_arguments(parser, [*args[:at], "--config", yaml.safe_dump(self.restored.config), *args[at:]])
            self.config[subcommand].ckpt_path = None  # given to the Trainer in after_instantiate_classes
        elif ckpt_given:
            super().parse_arguments(parser, args)  # no subcommand, no checkpoint: as given
        # A recipe class switched for another (the optimizer, say) starts from its own defaults.
        switched_to_own_defaults(self.config[subcommand] if subcommand else self.config, args, DEFAULT_CONFIG)
        if subcommand and self.config[subcommand].get("weights_only") is None:
            # Checkpoints hold tensors and primitives only: never unpickle anything else.
            self.config[subcommand]["weights_only"] = True
        if printing:
            dumped = yaml.safe_load(parser.dump(self.config, skip_check=True, skip_none=False))
            print(yaml.safe_dump(dumped.get(subcommand, dumped), sort_keys=False), end="")
            raise SystemExit(0)

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        if self.subcommand != "fit":
            # Evaluating a checkpoint restores its ModelCheckpoint state too; that the new run
            # directory differs from the training one is expected, not worth a warning.
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        if config.trainer.callbacks and config.trainer.enable_progress_bar is False:
            # The default callbacks include a progress bar; turning bars off should just work.
            config.trainer.callbacks = [c for c in config.trainer.callbacks if "ProgressBar" not in c.class_path]
        if config.trainer.sync_batchnorm and not (
            torch.cuda.is_available() and config.trainer.accelerator in ("auto", "gpu", "cuda")
        ):
            # PyTorch's SyncBatchNorm runs on CUDA only; a CPU (gloo) run keeps per-process statistics.
            rank_zero_warn("sync_batchnorm needs CUDA devices; this run keeps BatchNorm statistics per process")
            config.trainer.sync_batchnorm = False
        # Speed by default (cuDNN picks the fastest kernels); `deterministic: true` trades it
        # for bit-identical reruns: deterministic algorithms and no benchmark autotuning.
        if config.trainer.deterministic:
            config.trainer.benchmark = False
        elif config.trainer.benchmark is None:
            config.trainer.benchmark = True
        logger, *trackers = loggers_of(config)  # TensorBoard first: it writes the run directory
        resumed = self.restored.run_dir if self.restored and self.subcommand == "fit" else None
        if is_tensorboard(logger):
            # Absolute, so the checkpoint directory a resumed run sees is the one its
            # checkpoints recorded (ModelCheckpoint then restores its best-so-far state).
            logger.init_args.save_dir = str(Path(logger.init_args.save_dir).resolve())
            if self.run_name is not None:
                logger.init_args.name, logger.init_args.version = self.run_name
            if resumed is not None:  # logs on into the run directory the checkpoint lies in
                logger.init_args.name, logger.init_args.version = resumed.parent.name, resumed.name
            elif self.restored is not None and self.run_name is None and logger.init_args.name == recipe_run_name():
                logger.init_args.name = trained_run_name(self.restored.path) or logger.init_args.name
        if trackers:
            name = logger.init_args.get("name") if is_tensorboard(logger) else None
            if resumed is not None:
                continue_tracker_runs(trackers, resumed)
            config.trainer.logger = [logger, *resolve_trackers(trackers, runs_dir(config), name)]

    def instantiate_classes(self) -> None:
        """As LightningCLI does, with the DataModule built first: the network then gets the data's
        class count and channels where its signature takes them (a jsonargparse link would also write
        them into a network that does not, and fails on a function such as torchvision.models.resnet18),
        starts from pretrained weights (torchvision's, whose normalisation and input size the data takes
        unless given, or a ``weights_file``), and is checked against the data before any training
        (``template.nets.shape``)."""
        config = self.config.get(str(self.subcommand), self.config)
        data_config, net = config.data, config.model.init_args.net
        init_args = net.get("init_args") or Namespace()
        weights = weights_of(vars(init_args))  # torchvision's pretrained weights (template.nets.pretrained)
        if self.restored is not None:  # the checkpoint holds the trained weights, its head included: no file is read
            weights = config.weights_file = None
        if weights is not None or "weights" in init_args:
            init_args.weights = None  # built without them, loaded from the cache below (never torch hub's loader)
        weights_file = config.get("weights_file")
        if weights_file and not Path(weights_file).is_file():  # before any data is read
            raise FileNotFoundError(
                f"weights_file {weights_file}: no such file (in {Path(weights_file).resolve().parent}); give the path "
                "of a state_dict saved with torch.save or safetensors, or leave weights_file out"
            )
        data_args = data_config.get("init_args") or Namespace()
        if weights is not None:
            weights_file = weights_file or check_cached(weights)
            stats = weights.transforms()  # how the weights were trained: their normalisation and input size
            if "mean" in data_args and data_args.mean is None and data_args.get("std") is None:
                data_args.mean, data_args.std = list(stats.mean), list(stats.std)
            if "image_size" in data_args and data_args.image_size is None:
                data_args.image_size = stats.crop_size[0] if len(stats.crop_size) == 1 else list(stats.crop_size)
        parser = ArgumentParser(exit_on_error=False)
        parser.add_subclass_arguments(ImageDataModule, "data")
        instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # jsonargparse >= 4.49
        data = instantiate(parser.parse_object({"data": data_config.as_dict()})).data
        if isinstance(data.hparams, dict):  # what LightningCLI's own instantiation records: checkpoints name the class
            data.hparams["_class_path"] = data_config.class_path
        if "image_size" in data_args and data_args.image_size is None:  # config.yaml records the size used
            height, width = data.image_size
            data_args.image_size = height if height == width else [height, width]
        net.init_args = Namespace(
            **network_arguments(net.class_path, vars(init_args), data.num_classes, data.in_channels)
        )
        config.data = data  # jsonargparse takes an instance as it is: built once
        try:
            with warnings.catch_warnings():  # jsonargparse tries to write the instance out, and says it cannot
                warnings.filterwarnings("ignore", message=r"\s*Unable to serialize instance")
                super().instantiate_classes()
        finally:
            config.data = data_config  # the configuration stays one of values (config.yaml)
        if weights_file:
            load_pretrained(self.model.net, weights_file, head_name(self.model.net))
        check_fits(self.model.net, data.input_shape, data.num_classes)

    def after_instantiate_classes(self) -> None:
        """Refuse data that contradicts what the checkpoint was trained on: a silent resize or
        another class list would give confident answers to a different question."""
        if self.restored is None:
            return
        # The Trainer restores it (its tensors and states, checked by AtomicCheckpointIO); config.yaml records it.
        path = self.config_init[self.subcommand]["ckpt_path"] = self.config[self.subcommand]["ckpt_path"] = str(
            self.restored.path
        )
        data, trained = self.datamodule, self.restored.trained
        mismatches = []
        for key, what in (("input_shape", "inputs (channels, height, width)"), ("num_classes", "classes"),
                          ("class_names", "class names")):  # fmt: skip
            then, now = trained.get(key), getattr(data, key, None)
            if then is not None and now is not None and as_list(then) != as_list(now):
                mismatches.append(f"{what}: trained on {as_list(then)}, the data gives {as_list(now)}")
        if mismatches:
            raise ValueError(
                f"{path} does not fit this data; " + "; ".join(mismatches) + ". Leave out the data "
                "options that change them: evaluating a checkpoint starts from the data it was trained with."
            )
        if self.restored.preprocessing is not None and isinstance(data, ImageDataModule):
            # Normalised as in training, whatever DataModule is given, and without its training images.
            data.use_preprocessing(self.restored.preprocessing, source=path)

    def instantiate_trainer(self, **kwargs):
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the user configured
            # Written in the training thread, not by Lightning's AsyncCheckpointIO: ModelCheckpoint
            # deletes the previous best as soon as it has saved the new one, and a write still in
            # flight then leaves no best checkpoint to a crash.
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if self.subcommand != "predict":
            # It writes predictions and nothing else; elsewhere it would only add calls to every step.
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, PredictionWriter)]
        return trainer

    def after_validate(self) -> None:
        self.print_evaluated("val")

    def after_test(self) -> None:
        self.print_evaluated("test")

    def print_evaluated(self, split: str) -> None:
        """How many images the score is of: the whole split, or a part of it that options limited."""
        count, data = self.model.images_evaluated.get(split), self.datamodule
        if self.trainer.is_global_zero and count and f"{split}/acc" in self.trainer.callback_metrics:
            size = len(data.datasets[split]) if split in getattr(data, "datasets", {}) else count
            part = "the whole split" if count >= size else f"of {size}: limited by this command's options"
            acc = float(self.trainer.callback_metrics[f"{split}/acc"])
            print(f"{split}/acc {acc:.4f} on {count} images ({part})")

    def after_fit(self) -> None:
        if self.trainer.is_global_zero and self.trainer.fast_dev_run:
            print("fast_dev_run: a few batches through every step, nothing written (no run directory, no checkpoint)")
        elif self.trainer.is_global_zero:  # rank 0 alone prints, so it asks alone: no broadcast
            self.print_summary(Path(run_directory(self.trainer) or self.trainer.default_root_dir).resolve())

    def print_summary(self, run_dir: Path) -> None:
        # The best-by-validation checkpoint monitors a metric; last.ckpt, written every epoch, none.
        checkpoints = self.trainer.checkpoint_callbacks
        best = next((c for c in checkpoints if isinstance(c, ModelCheckpoint) and c.monitor), None)
        last = next((c for c in checkpoints if isinstance(c, ModelCheckpoint) and not c.monitor), None)
        lines = [f"run directory    {run_dir}"]
        if best is not None and best.best_model_path:
            lines += [
                f"best checkpoint  {best.best_model_path}",
                f"best {best.monitor:<11} {float(best.best_model_score):.4f}",
                *([f"last checkpoint  {last.best_model_path}"] if last is not None else []),
            ]
            # Only where `test` has images to read: a folder without test/ and test_fraction 0 has none.
            # Nor in a sweep's trial or a fold of cv, each one of many runs: test the one chosen, once.
            if getattr(self.datamodule, "has_test", True) and self.run_name is None:
                root = getattr(self.datamodule, "root", None)  # where the images are: the command says, never the file
                where = f" --data.root {root}" if root else ""
                lines.append(f"test it, once:   {PROGRAM} test --ckpt_path {best.best_model_path}{where}")
        rows = next((c.rows for c in self.trainer.callbacks if isinstance(c, TrainingMonitor)), [])
        if lrs := [(row["epoch"], row["lr"]) for row in rows if "lr" in row]:
            (first, lr), (last, lr_last) = lrs[0], lrs[-1]
            lines.append(
                f"learning rate    {lr:.3g} at epoch {first}" + f", {lr_last:.3g} at epoch {last}" * (last > first)
            )
        lines.append(f"curves:          tensorboard --logdir {run_dir}")
        configured = loggers_of(self.config.get(str(self.subcommand), self.config))[1:]
        lines += [where_to_look(tracker, settings) for tracker, settings in zip(self.trainer.loggers[1:], configured)]
        # soft_wrap: paths stay whole (and copyable) on narrow terminals and in logs.
        console = Console(soft_wrap=True)
        console.rule("run summary")
        for line in lines:
            console.print(line, highlight=False)


def with_default_config(argv: list[str], run: bool) -> list[str]:
    """``argv`` with ``--config DEFAULT_CONFIG`` first after the subcommand (at the start without
    one, for cli(run=False)), so that every --config file and option given overrides it."""
    if not DEFAULT_CONFIG.is_file():
        raise FileNotFoundError(
            f"{DEFAULT_CONFIG} is missing: the CLI reads the recipe's defaults from configs/ beside the "
            "package; run from a clone of the project, installed with pip install -e ."
        )
    if not run:
        return ["--config", str(DEFAULT_CONFIG), *argv]
    at = next((index + 1 for index, token in enumerate(argv) if token in SUBCOMMANDS), None)
    return argv if at is None else [*argv[:at], "--config", str(DEFAULT_CONFIG), *argv[at:]]


def recipe_run_name() -> str | None:
    """The run name the recipe's defaults give (runs/<name>/version_N), which a user's config may change."""
    logger = (yaml.safe_load(DEFAULT_CONFIG.read_text()).get("trainer") or {}).get("logger") or {}
    return (logger.get("init_args") or {}).get("name")


def trained_run_name(ckpt_path: Path) -> str | None:
    """The name of the run a checkpoint was trained in (runs/<name>/<version>/checkpoints/), or a loose
    checkpoint's file name: what evaluating it is named after, under the user's runs directory."""
    path = ckpt_path.resolve()
    name = path.parents[2].name if path.parent.name == "checkpoints" and len(path.parents) > 2 else path.stem
    return name if re.fullmatch(r"[A-Za-z0-9][\w.-]{0,99}", name) else None


def as_list(value) -> list | int:
    return list(value) if isinstance(value, list | tuple) else value


def cli(
    args: list[str] | None = None,
    run: bool = True,
    command: str | None = None,
    callbacks: tuple = (),
    run_name: tuple[str, str] | None = None,
) -> ClassificationCLI:
    """Build (and by default run) the CLI; ``args`` as on the command line, without the program name.

    ``run=False`` parses the options of ``fit`` without a subcommand and only builds the
    model, DataModule and Trainer, for commands such as ``doctor``, named by ``command``.
    ``callbacks``: objects added to the run's (an Optuna trial's pruner, say), not recorded in
    its config.yaml; ``run_name``: see ``ClassificationCLI.run_name``.
    """
    argv = with_default_config(list(sys.argv[1:] if args is None else args), run)
    commands = ",".join(EXTRA_COMMANDS)
    description = f"Train and evaluate image classifiers. Also: {PROGRAM} {{{commands}}} --help"
    with warnings.catch_warnings():
        # main() hands over sys.argv less the extra command's name: intended, not a mistake.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        cli_class = (
            ClassificationCLI
            if run_name is None
            else type("ClassificationCLI", (ClassificationCLI,), {"run_name": run_name})
        )
        return cli_class(
            ClassificationModule,
            ImageDataModule,
            subclass_mode_data=True,
            parser_class=ConciseArgumentParser,
            subclass_mode_model=True,
            # Always on, whatever `trainer.callbacks` says: the random state for exact resume and
            # the checkpoint on pre-emption. Fresh for every run.
            trainer_defaults={"callbacks": [ResumeState(), *callbacks]},
            auto_configure_optimizers=False,  # the optimizer is model.optimizer, built from parameter groups
            parser_kwargs={"prog": f"{PROGRAM} {command}" if command else PROGRAM, "description": description},
            # config.yaml and env.json in every run directory. A resumed run writes its
            # config.yaml again, into the run directory it continues.
            save_config_callback=RunRecord,
            save_config_kwargs={"overwrite": True},
            args=argv,
            run=run,
        )
