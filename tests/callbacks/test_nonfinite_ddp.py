import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_without_a_hang(tmp_path):
    # NaN pixels on rank 1 only: rank 0's own loss is finite, yet both must stop together.
    command = [
        sys.executable, "-m", "template", "fit", "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
        "--trainer.max_epochs", "3", "--data", "test_nonfinite.NaNDigits",
        "--data.init_args.nan_at_step", "12", "--data.init_args.nan_on_rank", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert result.stderr.count("error: non-finite") >= 2  # both ranks stopped, neither waited forever
    assert "at global step 12" in result.stderr
