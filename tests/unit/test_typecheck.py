"""The package type-checks: mypy (the project's [tool.mypy] config: non-strict,
check_untyped_defs) reports no error on src/mixq, and the package ships its py.typed marker."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "mixq"


@pytest.mark.slow  # a cold run checks ~65 modules (~20 s); later runs reuse .mypy_cache
def test_mypy_reports_no_error() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")],
                          cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    lines = proc.stdout.splitlines()
    errors = [ln for ln in lines if ": error:" in ln]
    summary = lines[-1] if lines else "(no output)"
    assert proc.returncode == 0, (
        f"mypy exit {proc.returncode}: {summary}\n" + "\n".join(errors[:30])
        + (f"\n... and {len(errors) - 30} more" if len(errors) > 30 else "")
        + (f"\nstderr:\n{proc.stderr[-2000:]}" if proc.stderr.strip() else ""))
    assert summary.startswith("Success: no issues found"), summary


def test_py_typed_marker_is_shipped() -> None:
    from setuptools.config.pyprojecttoml import read_configuration

    assert (PACKAGE / "py.typed").is_file()
    package_data = read_configuration(REPO / "pyproject.toml")["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["mixq"]
