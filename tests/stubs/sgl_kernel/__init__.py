"""A stand-in for the CUDA-only ``sgl_kernel`` package, for running SGLang on a CPU in tests.

PyPI ships no CPU build of sgl-kernel, yet SGLang imports a few names from it at module import
time. On a CPU without AMX SGLang never *calls* them (every op falls back to native torch), so
importing must succeed and any call must fail loudly. Used only by the CPU test servers: it is
put first on PYTHONPATH by ``tests/support/sglang_server.py`` and never installed anywhere.
"""

import sys

__version__ = "0.0.0-cpu-test-stub"


def copy_all_layer_kv_cache_cpu(*args, **kwargs):
    raise NotImplementedError("sgl_kernel.copy_all_layer_kv_cache_cpu is not available in the CPU test stub")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} was called, but the CPU test stub has no implementation")

    _missing.__name__ = name
    sys.stderr.write(f"[sgl_kernel CPU test stub] resolved {name}\n")
    return _missing
