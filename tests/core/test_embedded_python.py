"""The Python that the roles and playbooks run on hosts (``python -c`` snippets, ``-m`` modules,
rendered templates) names hsextract's modules by text: a rename in the package must break a test
here, not a play on a host."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_FILES = sorted(
    [
        *(REPO / "roles").rglob("*.yml"),
        *(REPO / "roles").rglob("*.j2"),
        *(REPO / "playbooks").glob("*.yml"),
        REPO / "extract.yml",
    ]
)
FROM_IMPORT = re.compile(r"^\s*from (hsextract[\w.]*) import ([\w, ]+)$", re.M)
DASH_M = re.compile(r"-m[\s,\"']+(hsextract(?:\.\w+)+)")


def _imports() -> list[tuple[str, str, str]]:
    out = []
    for path in ANSIBLE_FILES:
        text = path.read_text()
        for m in FROM_IMPORT.finditer(text):
            for name in m[2].split(","):
                out.append((str(path.relative_to(REPO)), m[1], name.strip()))
        out += [(str(path.relative_to(REPO)), m[1], "") for m in DASH_M.finditer(text)]
    return out


def test_the_roles_name_hsextract_modules_at_all():
    assert len(_imports()) >= 3, "the patterns found no import in the roles: are they stale?"


@pytest.mark.parametrize(("where", "module", "name"), _imports(), ids=lambda v: str(v))
def test_every_name_a_role_imports_from_hsextract_exists(where, module, name):
    mod = importlib.import_module(module)
    if name:
        assert hasattr(mod, name), f"{where}: {module} has no {name}"
