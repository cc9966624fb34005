"""An import-only stand-in for SGLang's CUDA kernel package ``sgl_kernel`` (sglang-kernel 0.4.10), for the
project's GPU test tier.

The real wheel (373 MB, built for torch 2.14.1) can neither travel to the H200 test machine nor load
its torch 2.11. SGLang 0.5.23 imports many names from ``sgl_kernel`` at module import time on CUDA,
but with ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` every fused op it runs takes its pure-torch path,
so the tier's models never call one of them: measured on the H200 (tiny Llama and DeepSeek-V3 at
TP 1, TP 2 and DP attention with decode CUDA graphs, the 8B-shaped Llama under load), no kernel
was called. So every name here resolves to a function that raises, naming the kernel, when it is
called, and ``import sgl_kernel.<anything>`` gives a module of such functions: an import never
fails, and a model or setting that does need a kernel fails loudly instead of computing something
else. Two pure-Python files of the real wheel, ``utils.py`` (``is_arch_support_pdl``, called by the
Triton attention backend) and ``scalar_type.py`` (quantization type tables, read at import time),
are copied in from the wheel by ``bench/gpu/build_bundle.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.4.10+hsextract-import-standin"


def _missing(qualname: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"{qualname} was called, but the GPU test tier's stand-in for sgl_kernel has no "
            "kernels (bench/gpu/standin/sgl_kernel)"
        )

    missing.__name__ = qualname.rsplit(".", 1)[-1]
    missing.__qualname__ = qualname
    return missing


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(f"{__name__}.{name}")


class _MissingModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__}.{name}")


class _MissingSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import sgl_kernel.X`` for an X this package lacks gives a module of raising functions.

    It sits last on ``sys.meta_path``, so the real files here (``utils``, ``scalar_type``) win."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _MissingModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MissingSubmodules) for f in sys.meta_path):
    sys.meta_path.append(_MissingSubmodules())
