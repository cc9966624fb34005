"""The suite's cache of compiled AnsiballZ module code (see ansiballz_site/sitecustomize.py).

Ansible runs every module task as a fresh zip, whose module_utils Python compiles from source at
each task. The plays of the sandbox and fleet tests run a few thousand tasks; with the compiled
code kept, a module process takes about half the CPU (a `stat` loop item 0.33 -> 0.18 CPU-s, on a
loaded 2-core machine). What the modules do is unchanged: the cache holds what `compile()` returns
for the same source.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

SITE = Path(__file__).with_name("ansiballz_site")
# Outside /tmp, which each sandbox replaces with a tmpfs of its own; bound into the sandboxes.
ROOT = Path("/var/tmp/hsextract-ansiballz")


@functools.cache
def root(base: Path = ROOT) -> Path:
    """The cache's directory (made, with the sitecustomize the module processes import): the path
    to bind into a sandbox so its plays and the host's share one cache. Made once per process:
    every command run in a sandbox asks for it."""
    (base / "code").mkdir(parents=True, exist_ok=True)
    (base / "site").mkdir(exist_ok=True)
    source = (SITE / "sitecustomize.py").read_bytes()
    target = base / "site" / "sitecustomize.py"
    if not target.is_file() or target.read_bytes() != source:
        # Replaced whole: a module process of the other pytest process may be importing it.
        tmp = target.with_name(f"sitecustomize.py.{os.getpid()}.tmp")
        tmp.write_bytes(source)
        os.replace(tmp, target)
    return base


def environment(base: Path = ROOT) -> dict[str, str]:
    """The variables that give a module process (and its controller) the cache."""
    base = root(base)
    return {"PYTHONPATH": str(base / "site"), "HSX_ANSIBALLZ_CACHE": str(base / "code")}


def with_cache(env: dict[str, str]) -> dict[str, str]:
    """`env` with the cache added: its site directory first on PYTHONPATH, before what was there."""
    cache = environment()
    path = ":".join(filter(None, [cache["PYTHONPATH"], env.get("PYTHONPATH", "")]))
    return {**env, **cache, "PYTHONPATH": path}
