import re

from lightning.pytorch.callbacks import RichProgressBar

from template.callbacks import ThrottledProgressBar, progress


def test_the_bar_takes_in_progress_at_most_refresh_rate_times_a_second_and_always_the_first_and_last(monkeypatch):
    shown = []
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda self, *args: shown.append(args[-1]))
    monkeypatch.setattr(ThrottledProgressBar, "total_train_batches", property(lambda self: 10))
    clock = iter([0.0, 0.1, 0.2, 0.6, 0.7, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = ThrottledProgressBar(refresh_rate=2)  # at most every 0.5 s
    for batch_idx in [*range(10), 0, 1]:  # an epoch of 10 batches, and the next one's first two
        bar.on_train_batch_end(None, None, None, None, batch_idx)
    # At 0.0 s, 0.6 s, 1.2 s, the epoch's last batch, and the next epoch's first, 0.1 s after it.
    assert shown == [0, 3, 5, 9, 0]


def test_a_fit_shows_its_speed_and_final_metrics_without_the_version_number(run_cli, capsys):
    # Epochs of 18 steps take well under the half second between updates: only the first and
    # last batches of each are taken in, and two samples are what the speed needs.
    fitted = run_cli(
        "fit", "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "true",
        "--trainer.callbacks", "[template.callbacks.ThrottledProgressBar]",
    )  # fmt: skip
    # Stopping the bar waits for Rich's redraw thread, which sleeps 1/rate between looks: 1/20 s,
    # not the half second of its two updates a second (every command ended that much later).
    assert fitted.trainer.progress_bar_callback.progress.live.refresh_per_second == progress.REDRAW_RATE == 20
    bar = capsys.readouterr().out.split("run summary")[0]
    assert "18/18" in bar and "val/acc: 0." in bar
    assert re.search(r"[1-9]\d*\.\d\dit/s", bar) and "v_num" not in bar
