"""A pure-torch stand-in for SGLang's CUDA kernel package ``sgl_kernel`` (sglang-kernel 0.4.10), for the
project's GPU test tier.

The real wheel (373 MB, built for torch 2.14.1) can neither travel to the H200 test machine nor load
its torch 2.11. SGLang 0.5.23 imports many names from ``sgl_kernel`` at module import time on CUDA,
so this package lets every import succeed and implements, in plain torch with the real signatures
and in-place semantics, the few kernels a bf16 Llama or DeepSeek-V3 can still reach once
``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` sends SGLang's fused ops to their torch paths:

* ``rmsnorm``, ``fused_add_rmsnorm``: the norms;
* ``silu_and_mul``: the act-and-mul fallback.

Each logs once, the first time it is called, so a server log says which of them really ran.
Every other name (quantization, fused MoE, KV-cache transfer, all-reduce, sampling renorm, which
the ``pytorch`` sampling backend never calls, ...) resolves to a function that raises naming the
kernel when called, and ``import sgl_kernel.<anything>`` gives a module of such functions: an
import never fails and an unexpected call fails loudly. Two pure-Python files of the real wheel,
``utils.py`` (``is_arch_support_pdl``, used by the Triton attention backend) and ``scalar_type.py``
(quantization type tables), are copied in from the wheel by ``bench/gpu/build_bundle.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import types

import torch
import torch.nn.functional as F

__version__ = "0.4.10+hsextract-torch-standin"

_log = logging.getLogger("sgl_kernel.standin")
_called: set[str] = set()


def _first_call(name: str) -> None:
    if name not in _called:
        _called.add(name)
        _log.warning("sgl_kernel stand-in: %s called (pure torch)", name)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, out: torch.Tensor | None = None,
            enable_pdl: bool | None = None) -> torch.Tensor:
    """``out = input / rms(input) * weight``; a new tensor unless ``out`` is given."""
    _first_call("rmsnorm")
    result = _rms(input, weight, eps)
    if out is None:
        return result
    out.copy_(result)
    return out


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      enable_pdl: bool | None = None) -> None:
    """In place: ``residual += input``, then ``input = rmsnorm(residual)``."""
    _first_call("fused_add_rmsnorm")
    total = input.float() + residual.float()
    residual.copy_(total.to(residual.dtype))
    input.copy_(_rms(total, weight, eps).to(input.dtype))


def silu_and_mul(input: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` with ``d`` half the last dimension."""
    _first_call("silu_and_mul")
    d = input.shape[-1] // 2
    result = F.silu(input[..., :d]) * input[..., d:]
    if out is None:
        return result
    out.copy_(result)
    return out


def _missing(qualname: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(f"{qualname} was called, but the torch stand-in for sgl_kernel does not "
                                  "implement it (bench/gpu/standin/sgl_kernel)")

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
