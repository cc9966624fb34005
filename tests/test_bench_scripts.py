"""Every bench script still loads against the package as it is now.

The benches are run by hand (and on the GPU host, where a broken script costs a paid machine's
start), never by the suite: a refactor that renamed a class one of them patched broke
`bench/drain_throughput.py` at import, unseen until it was next run. Loading each script's module
(its imports and module-level code, not its `main`) catches that in a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_LOAD_ALL = """
import importlib.util, sys, traceback
from pathlib import Path
broken = []
for path in map(Path, sys.argv[1:]):
    name = "hsextract_bench_" + path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(module)
    except BaseException:
        broken.append(f"{path}: {traceback.format_exc(limit=-3)}")
print("\\n".join(broken))
sys.exit(1 if broken else 0)
"""


def test_every_bench_script_loads_against_the_current_package():
    scripts = sorted(str(p.relative_to(ROOT)) for p in (*ROOT.glob("bench/*.py"), *ROOT.glob("bench/gpu/*.py")))
    assert len(scripts) >= 20, scripts
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_ALL, *scripts], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"bench scripts that no longer load:\n{done.stdout}\n{done.stderr[-3000:]}"
