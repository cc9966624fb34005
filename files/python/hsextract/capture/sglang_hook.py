"""The thin adapter between SGLang 0.5.23's model objects and the capture core and writer.

`install` is called by the generated patch package right after SGLang built the model (inside
the scheduler process, on every rank). It checks the server configuration, sets the capture
layers itself (never through ``set_eagle3_layers_to_capture``, whose DeepSeek variant adds +1
only when the first id is 1), and puts a forward hook on the inner decoder (``model.model``; for
Kimi-K2.5 ``model.language_model.model``) that hands each prefill batch to the writer.

Captured per token: the aux layers (SGLang's own capture: the residual stream entering layer
``i``), and the final hidden state: post-norm is the decoder's output, pre-norm is the residual
sum that enters the final norm (taken from a hook on ``model.norm``).

The decoder's hook takes the batch (`own_batch`: tensors of the capture's own, made before the
hook returns, since SGLang reuses its input buffers for the next batch); a hook on the model's
logits processor, which runs next in the same forward, adds the token SGLang's greedy sampler will
pick for each request (the argmax of its next-token logits; the client always asks for
temperature 0) and hands the batch to the writer.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hsextract import __version__ as hsextract_version
from hsextract.archs import ArchSpec, lookup
from hsextract.capture.config import CaptureConfig
from hsextract.capture.core import CaptureSettings, select_requests
from hsextract.capture.host_stage import OwnedBatch, greedy_tokens, own_batch
from hsextract.capture.preflight import (
    ServerFacts,
    check_dump_dir,
    check_server,
    check_sglang_version,
    sglang_version,
)
from hsextract.capture.ranks import attention_ranks, writes_dumps
from hsextract.capture.sink import CaptureSink, WriterOptions
from hsextract.capture.writer import CaptureWriter
from hsextract.capture.writer_process import ProcessCaptureWriter
from hsextract.errors import ConfigError, UnsupportedArchitecture
from hsextract.layers import CaptureLayers, resolve
from hsextract.staging.announcements import CaptureAnnouncement, write_announcement
from hsextract.staging.dumps import (
    CAPTURE_BATCH_UNUSABLE,
    CAPTURE_FAULT_INJECTED,
    CAPTURE_QUEUE_ERROR,
    dtype_name,
)

log = logging.getLogger("hsextract.capture")


def load_base_class(architecture: str) -> type:
    """SGLang's own class for `architecture`; raise naming the supported ones if there is none."""
    spec = lookup(architecture)
    module = importlib.import_module(spec.sglang_module)
    return getattr(module, spec.name)


def load_base_class_or_refusal(architecture: str, config: CaptureConfig | dict | None = None) -> type:
    """SGLang's class for `architecture`, or, for an unsupported one, a class whose construction
    fails with an error naming it and the supported ones.

    SGLang only logs (and skips) an external model module that fails to import, and would then
    serve the model with its own class and no capture; failing when the model is built makes
    the server start fail with the message instead. Given the patch's `config`, the refusal also
    names every other mistake in the settings (layers, dump directory, server flags): one failed
    start tells the operator everything to fix.
    """
    try:
        return load_base_class(architecture)
    except UnsupportedArchitecture as exc:
        unsupported = str(exc)
        log.error("hsextract capture: %s", unsupported)

        class _Unsupported(torch.nn.Module):
            def __init__(self, *args: Any, **kwargs: Any):
                hf_config = kwargs.get("config", args[0] if args else None)
                others = _problems_besides_the_architecture(config, hf_config) if config is not None else []
                raise UnsupportedArchitecture(" AND ".join([unsupported, *others]))

        return _Unsupported


def _problems_besides_the_architecture(config: CaptureConfig | dict, hf_config: Any) -> list[str]:
    """What else is wrong in the settings of a model whose architecture has no capture: the checks
    `install` makes, with the depth read from the model's own config (none without it)."""
    try:
        cfg = config if isinstance(config, CaptureConfig) else CaptureConfig.from_dict(config)
        facts = _server_facts()
    except Exception as exc:  # the architecture's refusal must reach the operator, whatever this is
        return [f"(the other settings were not checked: {exc})"]
    depth = getattr(text_part(hf_config), "num_hidden_layers", None)
    problems, _ = _settings_problems(
        cfg, facts, int(depth) if depth is not None else None, writes_dumps(_parallel_ranks(facts)[0])
    )
    return problems


def _parallel_ranks(facts: ServerFacts) -> tuple[int, int]:
    """(attention-TP rank, attention-DP rank) of this process; (0, 0) without distributed state.

    SGLang's published ranks when it has them; else derived from the TP rank and the server
    arguments (never the bare TP rank: under DP attention that would leave all but one
    attention-DP group without a writer, and their samples would never be dumped).
    """
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        return int(par.attn_tp_rank), int(par.attn_dp_rank)
    except Exception:
        try:
            from sglang.srt.distributed import get_tensor_model_parallel_rank

            tp_rank = int(get_tensor_model_parallel_rank())
        except Exception:
            return 0, 0
        return attention_ranks(tp_rank=tp_rank, tp_size=facts.tp_size, attn_dp_size=facts.attn_dp_size)


def _server_facts() -> ServerFacts:
    from sglang.srt.runtime_context import get_server_args

    return ServerFacts.from_server_args(get_server_args())


def causal_lm_of(model: Any, spec: ArchSpec) -> Any:
    """The *ForCausalLM that owns ``model`` (the decoder) and ``capture_aux_hidden_states``."""
    return getattr(model, spec.causal_lm_attr) if spec.causal_lm_attr else model


def text_config_of(causal_lm: Any) -> Any:
    return text_part(causal_lm.config)


def text_part(hf_config: Any) -> Any:
    """The text model's part of a Hugging Face config (a multimodal one nests it)."""
    return getattr(hf_config, "text_config", None) or hf_config


def set_capture_layers(causal_lm: Any, layers: CaptureLayers) -> None:
    """What SGLang's set_eagle3_layers_to_capture does, with ids the project translated itself."""
    causal_lm.capture_aux_hidden_states = True
    causal_lm.model.layers_to_capture = list(layers.sglang_layers_to_capture)


def register_cpu_mla() -> None:
    """torch_native attention has no DeepSeek handler in 0.5.23; its fallback (triton's MHA prefill)
    breaks on CPU, so route DeepSeek attention to the absorbed-MLA path (CPU test servers only)."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    AttentionBackendRegistry.register("torch_native", lambda attn, forward_batch: AttnForwardMethod.MLA)


class InjectedFault(RuntimeError):
    """Raised by the test-only fault switch in place of a real failure to queue a batch."""


class CaptureHook:
    """Forward hooks that hand each prefill batch's rows to the writer.

    A batch the hook cannot hand over (no prompt lengths, no pre-norm state, an error while
    queueing it) is not dropped: each of its requests is marked failed, so the client learns
    it must send the sample again.
    """

    def __init__(self, settings: CaptureSettings, writer: CaptureSink | None, fail_every_kth_batch: int = 0):
        self.settings = settings
        self.writer = writer
        self.tokens_hooked = False  # set once the logits processor's hook is installed
        self._pre_norm: torch.Tensor | None = None
        self._pending: tuple[Any, OwnedBatch] | None = None  # (forward batch, its rows) awaiting the tokens
        self._fail_every = fail_every_kth_batch  # test-only fault switch (0: off)
        self._batches = 0
        self._faulted: set[str] = set()  # rids the switch failed once: their resends go through
        self._warned_tokens = False

    def on_final_norm(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        """Keep the residual sum entering the final norm (the pre-norm final hidden state)."""
        if isinstance(output, tuple) and len(output) > 1 and output[1] is not None:
            self._pre_norm = output[1]
        elif args:
            self._pre_norm = args[0]
        else:
            self._pre_norm = kwargs.get("x", kwargs.get("hidden_states"))

    def on_decoder(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        pre_norm, self._pre_norm = self._pre_norm, None
        if self._pending is not None:  # the last batch's logits hook never came: hand it over as it is
            self._hand_over(None)
        if self.writer is None or not isinstance(output, tuple) or len(output) != 2:
            return
        fb = args[2] if len(args) > 2 else kwargs.get("forward_batch")
        if fb is None:
            return
        mode = fb.forward_mode
        if not mode.is_extend() or mode.is_target_verify() or mode.is_decode():
            return
        requests = select_requests(
            fb.rids, fb.extend_prefix_lens_cpu or [], fb.extend_seq_lens_cpu or [], self.settings
        )
        if not requests:
            return
        hidden, aux = output
        final = hidden if self.settings.final_hidden == "post_norm" else pre_norm
        if final is None:
            self._unusable(requests, "no pre-norm final hidden state was seen for this batch")
            return
        prompt_lens = fb.orig_seq_lens
        if prompt_lens is None:  # never seen for extend batches in 0.5.23; without it nothing can complete
            self._unusable(requests, "the batch carries no orig_seq_lens (prompt lengths)")
            return
        try:
            self._maybe_inject_fault(requests)
            batch = own_batch(self.settings, requests, aux, final, fb.input_ids, prompt_lens)
        except Exception as exc:
            self._not_queued(requests, exc)
            return
        self._pending = (fb, batch)
        if not self.tokens_hooked:
            self._hand_over(None)

    def on_logits(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        """The logits processor ran for the pending batch: its greedy tokens, then the hand-over."""
        if self._pending is None:
            return
        fb = args[3] if len(args) > 3 else kwargs.get("logits_metadata")
        if fb is not None and fb is not self._pending[0]:
            self._hand_over(None)  # the logits of another batch: the pending one goes without tokens
            return
        try:
            tokens = greedy_tokens(getattr(output, "next_token_logits", None), self._pending[1].batch_size)
        except Exception:
            log.exception("capture: reading the batch's greedy tokens failed; its dumps record none")
            tokens = None
        if tokens is None and not self._warned_tokens:
            self._warned_tokens = True
            log.warning(
                "capture: the logits processor's output holds no next-token logits per request; dumps "
                "record no greedy token (the drain's self-check skips them)"
            )
        self._hand_over(tokens)

    def _hand_over(self, tokens: torch.Tensor | None) -> None:
        assert self._pending is not None and self.writer is not None
        _, batch = self._pending
        self._pending = None
        try:
            self.writer.submit_owned(batch, tokens)
        except Exception as exc:
            self._not_queued(batch.requests, exc)

    def _not_queued(self, requests: list, exc: Exception) -> None:
        assert self.writer is not None
        injected = isinstance(exc, InjectedFault)
        if not injected:
            log.exception("capture: could not queue a batch of %d requests", len(requests))
        reason = CAPTURE_FAULT_INJECTED if injected else CAPTURE_QUEUE_ERROR
        self.writer.fail_requests(requests, reason, f"{type(exc).__name__}: {exc}")

    def _maybe_inject_fault(self, requests: list) -> None:
        """The test-only fault switch: fail every k-th batch of requests it has not failed before
        (so that every sample, sent again, gets through: a test of the path, not of luck)."""
        if not self._fail_every or any(r.rid in self._faulted for r in requests):
            return
        self._batches += 1
        if self._batches % self._fail_every == 0:
            self._faulted.update(r.rid for r in requests)
            raise InjectedFault(f"test-only fault switch: batch {self._batches} fails (every {self._fail_every}th)")

    def _unusable(self, requests: list, why: str) -> None:
        assert self.writer is not None
        log.error("capture: %s; its %d requests are marked failed", why, len(requests))
        self.writer.fail_requests(requests, CAPTURE_BATCH_UNUSABLE, why)


def _announce(cfg: CaptureConfig, settings: CaptureSettings, facts: ServerFacts) -> None:
    """Leave this capture's description in its dump dir, for the client's and the drain's checks;
    removed at this process's exit where it gets one (SGLang kills its schedulers with SIGKILL:
    then the readers remove it, see hsextract.staging.announcements.live_announcements)."""
    import atexit
    import socket
    import time

    from hsextract.staging.announcements import process_start_ticks, remove_announcement

    try:
        path = write_announcement(
            cfg.dump_dir,
            CaptureAnnouncement(
                dump_dir=str(Path(cfg.dump_dir).resolve()),
                rid_prefix=cfg.rid_prefix,
                final_hidden=cfg.final_hidden,
                format=cfg.format,
                hidden_size=settings.hidden_size,
                eagle_aux_hidden_state_layer_ids=list(settings.layers.eagle_aux_hidden_state_layer_ids),
                architecture=cfg.architecture,
                host=socket.gethostname(),
                pid=os.getpid(),
                port=facts.port,
                started_at=time.time(),
                proc_start=process_start_ticks(os.getpid()) or 0,
                precision=settings.precision,
            ),
        )
        atexit.register(remove_announcement, path, os.getpid())
    except OSError as exc:
        log.warning("hsextract capture: cannot announce itself in %s (%s)", cfg.dump_dir, exc)


def _settings_problems(
    cfg: CaptureConfig, facts: ServerFacts, num_hidden_layers: int | None, writes: bool
) -> tuple[list[str], CaptureLayers | None]:
    """Every problem of the settings (not just the first), and the capture's layers when they are
    valid; the layers are not checked when the model's depth is unknown."""
    layers: list[CaptureLayers] = []
    checks: list[Callable[[], object]] = [
        lambda: check_sglang_version(sglang_version()),
        lambda: check_server(facts),
    ]
    if num_hidden_layers is not None:
        checks.append(lambda: layers.append(resolve(cfg.aux_layer_ids, num_hidden_layers, cfg.layer_convention)))
    if writes:
        checks.append(lambda: check_dump_dir(cfg.dump_dir))
    problems: list[str] = []
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            problems.append(str(exc))
    return problems, (layers[0] if layers else None)


def _check_settings(cfg: CaptureConfig, facts: ServerFacts, num_hidden_layers: int, writes: bool) -> CaptureLayers:
    """The capture's layers, once every setting is checked; else a ConfigError listing every problem,
    so one failed start tells the operator everything to fix."""
    problems, layers = _settings_problems(cfg, facts, num_hidden_layers, writes)
    if problems or layers is None:
        raise ConfigError("hsextract capture: " + " AND ".join(problems))
    return layers


def _states_dtype(inner: Any) -> torch.dtype:
    """The dtype the states are staged in: the model's embedding's, else bfloat16."""
    embed = getattr(getattr(inner, "embed_tokens", None), "weight", None)
    if embed is not None and embed.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return embed.dtype
    return torch.bfloat16


def _make_writer(cfg: CaptureConfig, settings: CaptureSettings, facts: ServerFacts) -> CaptureSink:
    cuda = facts.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    options = WriterOptions(
        num_threads=cfg.writer_threads or (8 if cuda else 2),
        max_bytes_in_flight=cfg.max_bytes_in_flight or ((4 << 30) if cuda else (256 << 20)),
        pool_granularity=cfg.tunable("pool_granularity_bytes", 2 << 20),
        verify_rows=bool(cfg.tunable("verify_rows", 1)),
    )
    kind = ProcessCaptureWriter if cfg.writer_process else CaptureWriter
    return kind(Path(cfg.dump_dir), settings, options, device=device)


def _log_on(cfg: CaptureConfig, layers: CaptureLayers, attn_tp_rank: int, attn_dp_rank: int, writes: bool) -> None:
    """Say in the server's log what this scheduler's capture does."""
    log.warning(
        "hsextract capture on: %s, layers_to_capture=%s (eagle ids %s), final hidden %s, staged in %s, "
        "rid prefix %r, attn_tp_rank %d attn_dp_rank %d, %s",
        cfg.architecture,
        list(layers.sglang_layers_to_capture),
        list(layers.eagle_aux_hidden_state_layer_ids),
        cfg.final_hidden,
        cfg.precision,
        cfg.rid_prefix,
        attn_tp_rank,
        attn_dp_rank,
        (f"writing to {cfg.dump_dir}" + (" through a writer process" if cfg.writer_process else ""))
        if writes
        else "not writing (another rank writes)",
    )


def install(model: Any, config: CaptureConfig | dict) -> CaptureHook:
    """Switch the capture on for a freshly built SGLang model; raise ConfigError on bad settings."""
    cfg = config if isinstance(config, CaptureConfig) else CaptureConfig.from_dict(config)
    spec = lookup(cfg.architecture)
    facts = _server_facts()
    causal_lm = causal_lm_of(model, spec)
    text_cfg = text_config_of(causal_lm)
    attn_tp_rank, attn_dp_rank = _parallel_ranks(facts)
    layers = _check_settings(cfg, facts, int(text_cfg.num_hidden_layers), writes_dumps(attn_tp_rank))
    set_capture_layers(causal_lm, layers)
    if spec.mla and facts.device == "cpu" and facts.attention_backend in (None, "torch_native"):
        register_cpu_mla()
    inner = causal_lm.model
    settings = CaptureSettings(
        rid_prefix=cfg.rid_prefix,
        layers=layers,
        hidden_size=int(text_cfg.hidden_size),
        dtype=dtype_name(_states_dtype(inner)),
        final_hidden=cfg.final_hidden,
        architecture=cfg.architecture,
        model_path=cfg.model_path,
        sglang_version=sglang_version(),
        hsextract_version=hsextract_version,
        attn_dp_rank=attn_dp_rank,
        max_tracked=cfg.max_tracked_requests,
        precision=cfg.precision,
    )
    writer = _make_writer(cfg, settings, facts) if writes_dumps(attn_tp_rank) else None
    fault_every = cfg.tunable("testonly_fail_every_kth_batch", 0)
    if fault_every and writer is not None:
        log.error(
            "hsextract capture: TEST-ONLY FAULT SWITCH ON: every %dth prefill batch is failed on purpose "
            "(capture config extra.testonly_fail_every_kth_batch); never use this server for a real run",
            fault_every,
        )
    hook = CaptureHook(settings, writer, fault_every)
    if writer is not None:
        _announce(cfg, settings, facts)
    if cfg.final_hidden == "pre_norm":
        inner.norm.register_forward_hook(hook.on_final_norm, with_kwargs=True)
    inner.register_forward_hook(hook.on_decoder, with_kwargs=True)
    logits_processor = getattr(causal_lm, "logits_processor", None)
    if isinstance(logits_processor, torch.nn.Module):
        logits_processor.register_forward_hook(hook.on_logits, with_kwargs=True)
        hook.tokens_hooked = True
    _log_on(cfg, layers, attn_tp_rank, attn_dp_rank, writes=writer is not None)
    model._hsextract_capture = hook
    return hook
