"""The benchmark scripts stay runnable: tiny settings, and no timing is asserted."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_data_throughput_runs_end_to_end_and_reports_a_ratio():
    command = [sys.executable, "benchmarks/data_throughput.py", "--images", "400", "--epochs", "1", "--workers", "2"]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"ratio \(b\)/\(a\): [\d.]+x", result.stdout)
    assert "one-off cache build" in result.stdout and "baseline ImageFolder" in result.stdout
