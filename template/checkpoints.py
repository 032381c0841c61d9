"""Finding checkpoints by name: ``--ckpt_path best`` and ``--ckpt_path last``."""

from pathlib import Path

CHECKPOINT_ALIASES = ("best", "last")


def find_checkpoint(alias: str, runs_dir: str | Path) -> Path:
    """Return the best or last checkpoint of the most recent run under ``runs_dir``.

    The most recent run is the one whose ``checkpoints/last.ckpt`` was written last, so a
    `validate` or `test` run (which writes no checkpoints) never hides the run it evaluated.
    """
    if alias not in CHECKPOINT_ALIASES:
        raise ValueError(f"unknown checkpoint alias {alias!r}; use one of {CHECKPOINT_ALIASES} or a path")
    runs_dir = Path(runs_dir)
    lasts = sorted(runs_dir.glob("**/checkpoints/last.ckpt"), key=lambda path: path.stat().st_mtime)
    if not lasts:
        raise FileNotFoundError(
            f"--ckpt_path {alias}: no run with checkpoints/last.ckpt under {runs_dir.resolve()}; "
            f"train one with `{__package__} fit` first, or pass the path of a .ckpt file"
        )
    checkpoint_dir = lasts[-1].parent
    if alias == "last":
        return lasts[-1]
    bests = sorted(checkpoint_dir.glob("best*.ckpt"), key=lambda path: path.stat().st_mtime)
    if not bests:
        raise FileNotFoundError(f"--ckpt_path best: {checkpoint_dir} holds no best*.ckpt")
    return bests[-1]
