from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def readers() -> Path:
    root = os.environ.get("HSEXTRACT_READERS")
    if not root:
        pytest.skip("HSEXTRACT_READERS is not set: install requirements/readers.txt (make venv) to run reader tests")
    return Path(root)
