"""The command line: ``template fit | validate | test | predict`` through LightningCLI.

Everything a run is configured by is a typed ``__init__`` signature (network, module,
DataModule, Trainer) plus YAML in ``configs/``; LightningCLI turns them into options,
so a misspelt key or a wrongly typed value fails before any training starts.
"""

import logging
import warnings
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_only
from rich.console import Console

from template.callbacks import PredictionWriter
from template.checkpoints import CHECKPOINT_ALIASES, find_checkpoint
from template.data import ImageDataModule
from template.module import ClassificationModule

DEFAULT_RUNS_DIR = "runs"
PROGRAM = __package__  # the command's name is the package's: `template fit`, `python -m template`

# The defaults of `template fit` with no arguments: the embedded digits on the CPU in
# well under a minute. configs/default.yaml spells out the same values.
TRAINER_DEFAULTS = {
    "max_epochs": 30,
    "log_every_n_steps": 10,
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": DEFAULT_RUNS_DIR, "name": "digits", "default_hp_metric": False},
    },
}


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_NoAdverts())


class ClassificationCLI(LightningCLI):
    """LightningCLI with this project's defaults, argument links and run summary."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # Best checkpoint by validation accuracy (never by test), plus last.ckpt to resume.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(PredictionWriter, "predictions")
        parser.set_defaults(
            {
                # A list the user may replace (`trainer.callbacks`) or extend (`trainer.callbacks+`).
                "trainer.callbacks": [{"class_path": "lightning.pytorch.callbacks.RichProgressBar"}],
                "lr_monitor.logging_interval": "step",
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.save_last": True,
                "checkpoint.filename": "best-epoch{epoch:03d}",
                "checkpoint.auto_insert_metric_name": False,
                "data": {"class_path": "template.data.DigitsDataModule"},
                "model.net": {"class_path": "template.nets.ResNetSmall"},
                "model.optimizer": {
                    "class_path": "torch.optim.AdamW",
                    "init_args": {"lr": 0.003, "weight_decay": 0.05},
                },
                "model.lr_scheduler": {
                    "class_path": "template.module.WarmupCosine",
                    "init_args": {"warmup_fraction": 0.05},
                },
            }
        )
        # The DataModule knows the classes, channels and image size; the model is told,
        # so they are never stated twice.
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.input_shape", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.net.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.in_channels", "model.net.init_args.in_channels", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        if subcommand is None:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if ckpt_path in CHECKPOINT_ALIASES:
            try:
                resolved = find_checkpoint(ckpt_path, runs_dir(self.config[subcommand]))
            except FileNotFoundError as error:
                parser.error(str(error))
            print(f"--ckpt_path {ckpt_path} -> {resolved}")
            self.config[subcommand]["ckpt_path"] = str(resolved)

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        if self.subcommand != "fit":
            # Evaluating a checkpoint restores its ModelCheckpoint state too; that the new run
            # directory differs from the training one is expected, not worth a warning.
            warnings.filterwarnings("ignore", message="The dirpath has changed from")
        if config.trainer.fast_dev_run:
            # fast_dev_run turns the logger off, and last.ckpt would land in ./checkpoints.
            config.checkpoint.save_last = False

    @rank_zero_only
    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback
        run_dir = Path(self.trainer.log_dir or ".")
        lines = [f"run directory    {run_dir}"]
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_path:
            lines += [
                f"best checkpoint  {checkpoint.best_model_path}",
                f"best {checkpoint.monitor:<11} {float(checkpoint.best_model_score):.4f}",
                f"last checkpoint  {checkpoint.last_model_path}",
                f"test it, once:   {PROGRAM} test --ckpt_path {checkpoint.best_model_path}",
            ]
        lines.append(f"curves:          tensorboard --logdir {run_dir}")
        # soft_wrap: paths stay whole (and copyable) on narrow terminals and in logs.
        console = Console(soft_wrap=True)
        console.rule("run summary")
        for line in lines:
            console.print(line, highlight=False)


def runs_dir(config: Namespace) -> str:
    """Where the configured TensorBoard logger writes its runs."""
    logger = config.get("trainer", {}).get("logger")
    if isinstance(logger, Namespace) and logger.get("class_path", "").endswith("TensorBoardLogger"):
        return logger.get("init_args", {}).get("save_dir", DEFAULT_RUNS_DIR)
    return DEFAULT_RUNS_DIR


def cli(args: list[str] | None = None, run: bool = True) -> ClassificationCLI:
    """Build (and by default run) the CLI; ``args`` as on the command line, without the program name."""
    return ClassificationCLI(
        ClassificationModule,
        ImageDataModule,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        seed_everything_default=42,
        auto_configure_optimizers=False,  # the optimizer is model.optimizer, built from parameter groups
        args=args,
        run=run,
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``template`` command and of ``python -m template``."""
    cli(args)
