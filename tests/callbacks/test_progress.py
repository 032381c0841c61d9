from lightning.pytorch.callbacks import RichProgressBar

from template.callbacks import ThrottledProgressBar, progress


def test_the_bar_takes_in_progress_at_most_refresh_rate_times_a_second_and_always_the_last_batch(monkeypatch):
    shown = []
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda self, *args: shown.append(args[-1]))
    monkeypatch.setattr(ThrottledProgressBar, "total_train_batches", property(lambda self: 10))
    clock = iter([0.0, 0.1, 0.2, 0.6, 0.7, 1.2, 1.3, 1.4, 1.5, 1.6])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    bar = ThrottledProgressBar(refresh_rate=2)  # at most every 0.5 s
    for batch_idx in range(10):
        bar.on_train_batch_end(None, None, None, None, batch_idx)
    assert shown == [0, 3, 5, 9]  # at 0.0 s, 0.6 s, 1.2 s, and the epoch's last batch
