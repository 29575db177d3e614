"""Helpers for the framework examples' end-to-end tests (test_framework_*.py)."""

import json
import os
import re
from pathlib import Path

import shoal_e2e as e2e

VENV_ROOT = Path("/var/cache/shoal/venvs")


def require_venv(name):
    """The example's Python environment must exist: setup.sh makes it. Never skipped."""
    python = VENV_ROOT / name / "bin" / "python"
    assert python.is_file() and os.access(python, os.X_OK), (
        f"{python} is missing: run ./setup.sh (it makes {VENV_ROOT}/{name} from "
        f"examples/{name}/requirements.txt)")
    return python


def check_trained(r, chief, threshold):
    """The job succeeded and `chief` printed, last, final_accuracy=X >= threshold. Returns its
    JSON metrics line ({"metric": ...}) if it printed one, else {}."""
    assert r.returncode == 0, f"rc={r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    lines = [l[len(chief) + 3:] for l in r.stdout.splitlines() if l.startswith(f"{chief} | ")]
    assert lines, r.stdout
    m = re.fullmatch(r"final_accuracy=([0-9.]+)", lines[-1])
    assert m, f"{chief}'s last line is not final_accuracy=...:\n{r.stdout}"
    assert float(m.group(1)) >= threshold, r.stdout
    metrics = [json.loads(l) for l in lines if l.startswith("{") and '"metric"' in l]
    return metrics[-1] if metrics else {}
