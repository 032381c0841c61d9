"""The ``template`` command: fit / validate / test / predict, the tools beside them, one message for a mistake."""

import importlib
import sys
import warnings

import torch
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from template.checkpoints import CheckpointError
from template.cli import EXTRA_COMMANDS, PROGRAM, TRACEBACK_VARIABLE, cli, wants_traceback
from template.imports import find_own_modules
from template.options import SUBCOMMANDS
from template.text import printable


def main(args: list[str] | None = None) -> None:
    """The ``template`` command: a mistake ends in one message and exit status 1 (``TRACEBACK=1``: where)."""
    argv = sys.argv[1:] if args is None else args
    warnings.formatwarning = escaped_warning  # a warning may quote a file's name: no escape sequence in it runs
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")  # Lightning's own, every fit
    if args is None:
        find_own_modules(argv)  # --model my_module.X, as python -m finds it; no other file of where you run
    tool = EXTRA_COMMANDS.get(argv[0].replace("_", "-")) if argv else None  # lr_find, as its file and plot are named
    if argv and tool is None and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        choices = f"{', '.join(SUBCOMMANDS)}, or the tools {', '.join(EXTRA_COMMANDS)}"
        print(f"{PROGRAM}: error: no command {printable(argv[0])!r}: choose from {choices}", file=sys.stderr)
        raise SystemExit(2)
    try:
        if tool is not None:  # not Trainer methods, so not LightningCLI subcommands
            return importlib.import_module(tool).main(argv[1:])
        cli(args)
    except SIGTERMException:  # ResumeState has saved a checkpoint and said where
        raise SystemExit(143) from None  # 128 + SIGTERM, as a shell reports a process it ended
    except Exception as error:
        if wants_traceback():
            raise
        # A mistake in the data or the options is every DDP process's: said once, by rank 0.
        if rank_zero_only.rank == 0 or not isinstance(error, ValueError | FileNotFoundError):
            print(f"{PROGRAM}: error: {printable(explain(error))}", file=sys.stderr)  # a file's name: no escapes run
            print(f"({TRACEBACK_VARIABLE}=1 shows the traceback)", file=sys.stderr)
        raise SystemExit(1) from None
    # Lightning leaves the process group up; a gloo group alive at exit can abort the process, and torchrun
    # reports the run failed. Only after success: a failed rank may have left the others mid-collective.
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


FORMAT_WARNING = warnings.formatwarning


def escaped_warning(*args, **kwargs) -> str:
    """A warning as Python writes it, each control character in it written as an escape."""
    return printable(FORMAT_WARNING(*args, **kwargs))


def explain(error: BaseException) -> str:
    """What went wrong, in the words of the error that started it: jsonargparse wraps an error raised
    while building the DataModule or model (a missing folder, say) in its own, with the first as cause."""
    while error.__cause__ is not None and not isinstance(error, CheckpointError):  # which says which file
        error = error.__cause__
    message = str(error) or type(error).__name__
    if isinstance(error, PermissionError | NotADirectoryError):
        message += "; run where you may write, or set --trainer.logger.init_args.save_dir to such a folder"
    elif isinstance(error, KeyError | TypeError | AttributeError | IndexError):
        message = f"{type(error).__name__}: {message}"  # messages that do not say what they are on their own
    elif "conditioned on metric" in message:  # Lightning names its own key: the option is ours
        message += " (model.scheduler_monitor): name a metric the module logs (val/loss, val/acc, train/loss)"
    elif "more than one stateful callback of type `ModelCheckpoint`" in message:  # a user's beside the recipe's two
        message += (
            " The recipe keeps two already: checkpoint (the best by checkpoint.monitor; --checkpoint.save_top_k -1 "
            "keeps every validated epoch) and last_checkpoint (last.ckpt, every epoch); give yours another monitor, "
            "mode or every_n_epochs than theirs"
        )
    elif "could not find the monitored key" in message:
        message += (" A module that overrides on_validation_epoch_end (or on_train_/on_test_epoch_end) calls "
                    "super() there: ClassificationModule logs val/loss and val/acc (train/acc, test/...) in it.")  # fmt: skip
    return message
