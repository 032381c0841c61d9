"""What a command says at its end: the run summary of a fit, how many images an evaluation scored."""

from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from rich.console import Console

from template.callbacks import TrainingMonitor
from template.callbacks.nonfinite import outputs_problem
from template.restore import named_again, places_again
from template.runs import loggers_of
from template.text import shown, shown_command
from template.tracking import where_to_look

PROGRAM = __package__


def evaluated(cli, split: str) -> tuple[int, int]:
    """How many images of ``split`` the last evaluation scored (0: none), and how many the split holds."""
    count, data = getattr(getattr(cli, "model", None), "images_evaluated", {}).get(split) or 0, cli.datamodule
    return count, len(data.datasets[split]) if split in getattr(data, "datasets", {}) else count


def print_evaluated(cli, split: str) -> None:
    if problem := outputs_problem(f"{split}/loss", float(cli.trainer.callback_metrics.get(f"{split}/loss", 0.0))):
        raise ValueError(problem)  # refused, not printed
    count, size = evaluated(cli, split)
    if cli.trainer.is_global_zero and count and f"{split}/acc" in cli.trainer.callback_metrics:
        part = "the whole split" if count >= size else f"of {size}: limited by this command's options"
        acc = float(cli.trainer.callback_metrics[f"{split}/acc"])
        print(f"{split}/acc {acc:.4f} on {count} images ({part})")


def kept_checkpoints(cli) -> list[ModelCheckpoint | None]:
    """The run's best-by-validation and last ModelCheckpoints, the recipe's ``checkpoint`` and ``last_checkpoint``
    (None where checkpointing is off): never one a user adds beside them, keeping bests by another metric."""
    config = cli.config_init.get(cli.subcommand) if cli.subcommand else cli.config_init
    found = [config.get(section) for section in ("checkpoint", "last_checkpoint")]
    return [each if any(each is callback for callback in cli.trainer.callbacks) else None for each in found]


def print_summary(cli, run_dir: Path) -> None:
    best, last = kept_checkpoints(cli)
    lines = [f"run directory    {shown(run_dir)}"]
    count, size = evaluated(cli, "val")  # a score of part of the split (limit_val_batches) says so
    part = f" on {count} of {size} val images (limited by this command's options)" if 0 < count < size else ""
    if best is not None and best.monitor and best.best_model_path:
        part = part if best.monitor.startswith("val") else ""
        # These paths are a resumed checkpoint's word: a file from elsewhere may have written them.
        lines += [
            f"best checkpoint  {shown(best.best_model_path)}",
            f"best {shown(f'{best.monitor:<11}')} {float(best.best_model_score):.4f}" + part,
            *([f"last checkpoint  {shown(last.best_model_path)}"] if last is not None and last.best_model_path else []),
        ]
        config = cli.config.get(str(cli.subcommand), cli.config).as_dict()
        again = [*named_again(config), *places_again(config)]  # your own classes, where the data is: named again
        monitor = next((c for c in cli.trainer.callbacks if isinstance(c, TrainingMonitor)), None)
        if last is not None and last.best_model_path and monitor and (step := monitor.validated_step) is not None:
            if (steps := cli.trainer.global_step - step) > 0:  # max_steps within an epoch, check_val_every_n_epoch
                validate = shown_command([PROGRAM, "validate", "--ckpt_path", last.best_model_path, *again])
                lines.append(f"not validated:   its last {steps} steps, after global step {step}: {validate}")
        # Only where `test` has images to read, and not in a sweep's trial or cv's fold: test the one chosen, once.
        if getattr(cli.datamodule, "has_test", True) and cli.run_name is None:
            test = [PROGRAM, "test", "--ckpt_path", best.best_model_path, *again]
            lines.append(f"test it, once:   {shown_command(test)}")
    rows = next((c.rows for c in cli.trainer.callbacks if isinstance(c, TrainingMonitor)), [])
    if lrs := [(row["epoch"], row["lr"]) for row in rows if "lr" in row]:
        (first, lr), (final, lr_final) = lrs[0], lrs[-1]
        lines.append(
            f"learning rate    {lr:.3g} at epoch {first}" + f", {lr_final:.3g} at epoch {final}" * (final > first)
        )
    if any(isinstance(logger, TensorBoardLogger) for logger in cli.trainer.loggers):  # none: --trainer.logger false
        lines.append(f"curves:          {shown_command(['tensorboard', '--logdir', run_dir])}")
    configured = loggers_of(cli.config.get(str(cli.subcommand), cli.config))[1:]
    lines += [shown(where_to_look(tracker, settings)) for tracker, settings in zip(cli.trainer.loggers[1:], configured)]
    # soft_wrap: paths stay whole (and copyable) on narrow terminals and in logs; no emoji: a path's ":smile:" is text.
    console = Console(soft_wrap=True, emoji=False)
    console.rule("run summary")
    for line in lines:
        console.print(line, highlight=False)
