from pathlib import Path

import pytest


@pytest.fixture
def traces_dir() -> Path:
    """Small trace files cut from the public traces (see its README.md)."""
    return Path(__file__).resolve().parents[1] / "fixtures" / "traces"
