import subprocess
import sys
from pathlib import Path


def test_ruff_finds_nothing():
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
