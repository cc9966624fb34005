"""The controller's Ansible, as `make test` provides it to the tests that run ansible-playbook."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def ansible_bin() -> Path:
    """The controller venv's bin dir (ansible-playbook, its python), or skip the test saying why."""
    bin_dir = os.environ.get("HSEXTRACT_ANSIBLE_BIN")
    if not bin_dir:
        pytest.skip("$HSEXTRACT_ANSIBLE_BIN is not set (make test sets it to the controller venv's bin dir)")
    return Path(bin_dir)
