"""Where the bench finds things and the choices it holds fixed: one place, so that the modules that
start servers, run the product and sum up the rounds agree on ports, format and sides."""

from __future__ import annotations

from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[1]  # bench/gpu
REPO = GPU_DIR.parents[1]
SITE = Path("/tmp/hsx-gpu-site")
FORMAT = "specforge"  # the project's default format (the capture patch's default final-norm placement)
PORT = 30400
MODEL_KINDS = ("llama8b", "dsv3", "tiny")
DEFAULT_MODELS = "llama8b,dsv3"  # "tiny": the client's ceiling (a tiny Llama on the GPU answers at once)
# "pipeline_drain_first": the drain started first and up (its worker processes too) before the client starts, as
# the units run them (the drain's unit runs from the converge; the client's starts after the server's minutes of
# loading): the whole pipeline from the client's start, without the drain's own start-up.
# "pipeline_drain_first_fp8": the same with the rows stored in FP8 (--precision fp8; the format must read it),
# quantized by the drain; "pipeline_drain_first_fp8_capture": quantized by the capture on the GPU, on a capture
# server of precision fp8, whose own pace is "loop_on_capture_fp8".
# "client_alone": the client with no staging limit and the drain started after it: the client's own ceiling and the
# drain's, each apart from the other (the tiny model only: everything it sends stays staged until the drain runs)
ALL_SIDES = (
    "plain_loop",
    "loop_on_capture",
    "loop_on_capture_no_overlap",
    "pipeline",
    "pipeline_2_processes",
    "client_alone",
    "pipeline_drain_first",
    "pipeline_drain_first_fp8",
    "loop_on_capture_fp8",
    "pipeline_drain_first_fp8_capture",
)
# The sides that run on a capture server staging FP8 (the capture's precision fp8: quantized on the GPU).
FP8_CAPTURE_SIDES = ("loop_on_capture_fp8", "pipeline_drain_first_fp8_capture")
