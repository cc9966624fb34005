"""Replaces SGLang 0.5.23's ``sglang/kernels/ops/gemm/cutedsl_dual_gemm.py`` in the GPU test tier's install.

That module imports ``cutlass`` (nvidia-cutlass-dsl, 486 MB, too large to travel to the H200 test
machine) at import time, for a CuTe-DSL dual GEMM that runs on SM100 only. On the H200 (SM90)
SGLang asks ``can_use_dual_gemm`` and never calls the GEMM; this module keeps the import working
and answers no. ``bench/gpu/gpu_env.py`` copies it over the installed module.
"""

from enum import IntEnum

MAX_DUAL_GEMM_DECODE_TOKENS = 16


class DualGemmQuantMode(IntEnum):
    STATIC_PER_TENSOR = 0
    STATIC_PER_TOKEN = 1
    DYNAMIC_PER_TENSOR = 2
    DYNAMIC_PER_TOKEN = 3
    UNQUANT = 4

    @property
    def is_quantized(self) -> bool:
        return self is not self.UNQUANT

    @property
    def is_dynamic(self) -> bool:
        return self in (self.DYNAMIC_PER_TENSOR, self.DYNAMIC_PER_TOKEN)

    @property
    def is_per_token(self) -> bool:
        return self in (self.STATIC_PER_TOKEN, self.DYNAMIC_PER_TOKEN)


def can_use_dual_gemm(*args, **kwargs) -> bool:
    return False


def _unavailable(*args, **kwargs):
    raise RuntimeError("the CuTe-DSL dual GEMM (SM100 only) is not available in the GPU test tier")


dual_gemm_swiglu = dual_gemm_swiglu_fp8 = _unavailable
