import lightning as L

from template.callbacks.hooks import BATCH_HOOKS, skip_empty_batch_hooks


class EndOnly(L.Callback):
    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends += 1


class Inherits(EndOnly):
    """Implements nothing itself: its parent's hook is still its own."""


def test_only_the_hooks_a_callback_leaves_empty_are_skipped():
    callbacks = [EndOnly(), Inherits()]
    own = L.Callback()
    own.on_before_backward = lambda trainer, pl_module, loss: None  # set on the instance, not the class
    skipped = skip_empty_batch_hooks([*callbacks, own])
    assert callable(own.on_before_backward) and own.on_after_backward is None
    for callback in callbacks:
        assert callable(callback.on_train_batch_end)
        assert all(getattr(callback, hook) is None for hook in BATCH_HOOKS if hook != "on_train_batch_end")
    assert "EndOnly.on_before_backward" in skipped and "EndOnly.on_train_batch_end" not in skipped
    assert EndOnly.on_before_backward is L.Callback.on_before_backward  # the class itself is untouched


def test_lightning_calls_the_implemented_hooks_and_never_enters_the_skipped_ones(run_cli):
    # The CLI skips the empty hooks of every callback it builds; the simple profiler records each
    # hook Lightning enters, so a skipped one must be missing from it, an implemented one present.
    run = run_cli(
        "fit", "--trainer.max_steps", "5", "--trainer.limit_val_batches", "1", "--trainer.profiler", "simple",
        "--trainer.callbacks+=test_hooks.EndOnly",
    )  # fmt: skip
    trainer = run.trainer
    entered = set(trainer.profiler.recorded_durations)
    end_only = next(callback for callback in trainer.callbacks if isinstance(callback, EndOnly))
    assert end_only.ends == 5
    assert f"[Callback]{end_only.state_key}.on_train_batch_end" in entered
    assert f"[Callback]{end_only.state_key}.on_before_backward" not in entered
    checkpoint = trainer.checkpoint_callback
    assert checkpoint.on_before_backward is None
    assert f"[Callback]{checkpoint.state_key}.on_train_batch_end" in entered  # ModelCheckpoint's own hook
    assert f"[Callback]{checkpoint.state_key}.on_before_backward" not in entered
