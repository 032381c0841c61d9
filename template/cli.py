"""The command line: ``template fit | validate | test | predict`` through LightningCLI: typed ``__init__``
signatures plus YAML in ``configs/``, so a misspelt key or a wrongly typed value fails before any training."""

import json
import pkgutil
import sys
import warnings
from pathlib import Path

from jsonargparse import Namespace
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_warn

from template import options
from template.callbacks import NonFiniteGuard, PredictionWriter, ResumeState, RunRecord, TrainingMonitor
from template.callbacks.resume import Trainer
from template.callbacks.run_record import run_directory
from template.checkpoints import AtomicCheckpointIO, load_pretrained
from template.compat import name_restore_errors, number_past_every_version
from template.data import ImageDataModule
from template.data.base import instantiate_data
from template.module import ClassificationModule
from template.nets.pretrained import check_trained_head, head_name, pretrained
from template.nets.shape import check_fits, check_given, network_arguments
from template.options import DEFAULT_CONFIG, EXTRA_COMMANDS, TRACEBACK_VARIABLE, wants_traceback
from template.plugins import SyncBatchNorm
from template.restore import Restored, check_restored_model, fit_data, for_command
from template.runs import place_run
from template.summary import print_evaluated, print_summary

__all__ = ["EXTRA_COMMANDS", "TRACEBACK_VARIABLE", "wants_traceback"]
PROGRAM = __package__  # the command's name is the package's: `template fit`, `python -m template`

# Callbacks every run has, each with a section of its own (--checkpoint.monitor...), set in DEFAULT_CONFIG.
CALLBACKS = {
    "checkpoint": ModelCheckpoint,  # the best by validation
    "last_checkpoint": ModelCheckpoint,
    "lr_monitor": LearningRateMonitor,
    "predictions": PredictionWriter,
    "nonfinite": NonFiniteGuard,
    "monitor": TrainingMonitor,
}


class ClassificationCLI(LightningCLI):
    """LightningCLI with this project's defaults, argument links and run summary."""

    # (name, version) of the run directory under save_dir when a command places many fits (sweep, cv).
    run_name: tuple[str, str] | None = None

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        for section, callback in CALLBACKS.items():
            parser.add_lightning_class_args(callback, section)
        # The data's classes, channels and size, told to the model (to the network: instantiate_classes).
        for key in ("num_classes", "class_names", "input_shape"):
            parser.link_arguments(f"data.{key}", f"model.init_args.{key}", apply_on="instantiate")
        parser.add_argument("--weights_file", type=str | None, help="a state_dict the network starts from (README)")

    def parse_arguments(self, parser: LightningArgumentParser, args) -> None:
        """Parse as LightningCLI does. With ``--ckpt_path``, the checkpoint read as data by ``template.restore`` (not
        by Lightning) is the first --config after the recipe's defaults: every --config and option given overrides
        it."""
        self.restored: Restored | None = None
        printing = [token for token in args if token.split("=")[0] == "--print_config"]  # at the end: what runs
        args = [token for token in args if token not in printing]
        ckpt_given = options.names_checkpoint(args)
        options.warn_overridden(args)
        # --data options may be for the checkpoint's DataModule, not yet known: left out until it is.
        super().parse_arguments(parser, options.without_data_options(args) if ckpt_given else args)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path:
            # Read as data, before anything it names is imported (template.restore); a refusal is the file's, not
            # the options': it ends as any bad input does (template.commands), status 1 and no usage line.
            self.restored = for_command(ckpt_path, self.config[subcommand], self.model_class, subcommand, args)
            # JSON (YAML whose strings are always quoted): a class named "1e3" stays a string.
            args = options.with_record(args, subcommand, json.dumps(self.restored.config))
            try:
                super().parse_arguments(parser, args)
            except SystemExit:  # an option's value it refuses may be the checkpoint's, not one given
                sys.stderr.write(f"(options read over the record of {self.restored.path}, which set those not given)\n")
                raise
            self.config[subcommand].ckpt_path = None  # given to the Trainer in after_instantiate_classes
        elif ckpt_given:
            super().parse_arguments(parser, args)  # no subcommand, no checkpoint: as given
        if self.restored and (weights_file := self.config[subcommand].get("weights_file")):  # a requeue's options
            rank_zero_warn(
                f"--weights_file {weights_file} not read: --ckpt_path {ckpt_path} holds all the network's weights (to "
                "start a new run from a checkpoint's weights, give it as --weights_file alone)"
            )
            self.config[subcommand].weights_file = None  # nor recorded in config.yaml
        options.switched_to_own_defaults(self.config[subcommand] if subcommand else self.config, args, DEFAULT_CONFIG)
        options.draw_seed(self.config[subcommand] if subcommand else self.config, self.restored)
        if subcommand and self.config[subcommand].get("weights_only") is None:
            # Checkpoints hold tensors and primitives only: never unpickle anything else.
            self.config[subcommand]["weights_only"] = True
        if printing:  # with the checkpoint: what it prints is what a `--config` of it would run
            if self.restored is not None:
                self.config[subcommand].ckpt_path = str(self.restored.path)
            options.print_config(parser, self.config, subcommand)

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        if self.subcommand != "fit":  # evaluating: the training callbacks' states are not needed, nor their places
            warnings.filterwarnings(
                "ignore", message="The dirpath has changed from|Be aware that when using `ckpt_path`"
            )
        options.settle_trainer(config.trainer, config.get("last_checkpoint"), config.get("checkpoint"))
        resumed = self.restored.run_dir if self.restored and self.subcommand == "fit" else None
        if self.restored:
            check_restored_model(self.restored, config.model.as_dict(), resuming=self.subcommand == "fit")
        place_run(config, self.run_name, resumed, self.restored and self.restored.path, self.subcommand == "fit")

    def instantiate_classes(self) -> None:
        """As LightningCLI does, the DataModule first: the network gets its class count and channels where its
        signature takes them (a link would fail on a torchvision builder), pretrained weights, and a shape check."""
        config = self.config.get(str(self.subcommand), self.config)
        data_config, net = config.data, config.model.init_args.net
        init_args, data_args = net.get("init_args") or Namespace(), data_config.get("init_args") or Namespace()
        # A checkpoint holds its trained weights, its head included: no other file is read.
        evaluating = self.subcommand if self.subcommand in options.EVALUATING and self.restored is None else None
        weights_file = pretrained(
            net.class_path, init_args, data_args, config.get("weights_file"), self.restored is None, evaluating
        )
        data = instantiate_data(data_config)
        if self.restored is None:  # a checkpoint's sizes are held to the data by fit_data, which names the file
            linked = {key: getattr(data, key) for key in ("num_classes", "class_names", "input_shape")}
            check_given(pkgutil.resolve_name(config.model.class_path), config.model.init_args, linked, "model")
            sizes = {"num_classes": data.num_classes, "in_channels": data.in_channels}
            check_given(pkgutil.resolve_name(net.class_path), init_args, sizes, "model.net")
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
        new_head = load_pretrained(self.model.net, weights_file, head_name(self.model.net)) if weights_file else None
        check_fits(self.model.net, data.input_shape, data.num_classes)
        if evaluating:
            check_trained_head(self.model.net, new_head, evaluating)

    def after_instantiate_classes(self) -> None:
        """The checkpoint for the Trainer to restore, and the data held to what it was trained on."""
        if self.restored is not None:  # the Trainer restores it through AtomicCheckpointIO; config.yaml records it
            ckpt_path = self.config[self.subcommand].ckpt_path = str(self.restored.path)
            self.config_init[self.subcommand]["ckpt_path"] = ckpt_path
            fit_data(self.restored, self.datamodule)

    def instantiate_trainer(self, **kwargs):
        trainer_config = (self.config_init.get(str(self.subcommand)) or self.config_init).get("trainer") or {}
        if trainer_config.get("sync_batchnorm"):  # timm's norm-and-activation layers kept whole (template.plugins)
            plugins = trainer_config.get("plugins") or []
            kwargs["plugins"] = [*(plugins if isinstance(plugins, list) else [plugins]), SyncBatchNorm()]
        trainer = super().instantiate_trainer(**kwargs)
        name_restore_errors(trainer)  # an error restoring --ckpt_path names the file
        for logger in trainer.loggers:
            number_past_every_version(logger)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # not one the user configured
            # In the training thread, not Lightning's AsyncCheckpointIO: ModelCheckpoint deletes the previous best
            # once it has saved the new, and a write still in flight would leave no best checkpoint to a crash.
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        if not trainer.loggers:  # --trainer.logger false: no learning rate to log anywhere
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LearningRateMonitor)]
        if self.subcommand != "predict":  # elsewhere it would only add calls to every step
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, PredictionWriter)]
        return trainer

    def after_validate(self) -> None:
        print_evaluated(self, "val")

    def after_test(self) -> None:
        print_evaluated(self, "test")

    def after_fit(self) -> None:
        if self.trainer.is_global_zero and self.trainer.fast_dev_run:
            print("fast_dev_run: a few batches through every step, nothing written (no run directory, no checkpoint)")
        elif self.trainer.is_global_zero:  # rank 0 alone prints, so it asks alone: no broadcast
            print_summary(self, Path(run_directory(self.trainer) or self.trainer.default_root_dir).resolve())


def cli(
    args: list[str] | None = None,
    run: bool = True,
    command: str | None = None,
    callbacks: tuple = (),
    run_name: tuple[str, str] | None = None,
) -> ClassificationCLI:
    """Build (and by default run) the CLI on ``args``, the command line less the program name. ``run=False`` builds
    what ``fit`` would, for ``command`` (``doctor``...); ``callbacks`` are added, not recorded (a pruner)."""
    argv = options.with_default_config(list(sys.argv[1:] if args is None else args), run)
    commands = ",".join(EXTRA_COMMANDS)
    description = f"Train and evaluate image classifiers. Also: {PROGRAM} {{{commands}}} --help"
    with warnings.catch_warnings():
        # main() hands over sys.argv less the extra command's name: intended, not a mistake.
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
        placed = {"run_name": run_name} if run_name else {}
        return type("ClassificationCLI", (ClassificationCLI,), placed)(
            ClassificationModule,
            ImageDataModule,
            trainer_class=Trainer,  # on SIGTERM, stops once a group of accumulated gradients has stepped
            subclass_mode_data=True,
            parser_class=options.ConciseArgumentParser,
            subclass_mode_model=True,
            # Always on, whatever `trainer.callbacks` says: exact resume and the checkpoint on pre-emption.
            trainer_defaults={"callbacks": [ResumeState(), *callbacks]},
            auto_configure_optimizers=False,  # the optimizer is model.optimizer, built from parameter groups
            parser_kwargs={"prog": f"{PROGRAM} {command}" if command else PROGRAM, "description": description},
            save_config_callback=RunRecord,  # config.yaml and env.json in every run directory (a resume's too)
            save_config_kwargs={"overwrite": True},
            args=argv,
            run=run,
        )
