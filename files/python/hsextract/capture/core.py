"""The capture's decisions, free of SGLang, CUDA and file I/O: which rows of a batch to keep,
where they go in each request's staged file, and when a request's dump is complete.

A prefill batch packs its requests' rows one after another. For each request the batch says
its rid, how many tokens of it were already in the KV cache (the prefix: earlier chunks, or a
cached prefix) and how many rows this forward computes (the extend length). The prompt length
is known only on the device in SGLang (``orig_seq_lens``); the writer reads it after the batch's
asynchronous copy lands, so the decisions that need it (`CapturePlanner.plan`) run on the
writer's thread, while the cheap rid filter (`select_requests`) runs inside the forward pass.

Rules, each one a reason a training sample could otherwise be silently wrong:

* only extend rows are kept (never decode steps, never speculative target-verify batches), and
  only rows inside the prompt: the decode rows of a MIXED batch lie past the prompt and drop out;
* only rids of the form the client makes, ``<prefix>-<run id>-<index>`` (or ``-p<hex>``, a
  probe): health checks, warmup and other clients' traffic are never written, and neither is a
  rid that would not be one plain name in the staging directory (``/``, ``..``);
* each chunk is placed at its row offset; the dump is complete only when the covered rows are
  exactly ``[0, prompt_len)``. A request first seen past row 0 (a cached prefix, or a decode row
  of a request no longer tracked) is not written at all, so a sample missing its prefix is
  never handed to the drain;
* a request sent again from row 0 before it was complete (the server aborted the earlier send:
  its client died mid-prefill, and SGLang does not tell the capture) starts a new dump: the file
  is created anew and the aborted send's rows and fingerprint are dropped;
* once a request is complete, later forwards of the same rid (a re-prefill after retraction)
  are ignored, so they cannot overwrite a finished dump; only a resend of the same prompt after
  its dump has left the staging directory starts a new dump;
* tracking is bounded (LRU): an abandoned request cannot grow memory forever;
* a request the capture cannot stage (rows it never saw, a write or queue error) is marked
  failed, and the writer leaves ``failed.json`` with the reason for the client, which sends the
  sample again; later chunks of a failed request are ignored, and the resend starts a new dump;
* a request SGLang refused before running it (it runs a 1-token placeholder, token id 0, in its
  place: ``Req.set_finish_with_abort``) is never marked done: it is failed as ``server_aborted``;
* each chunk adds its rows' fingerprint values (`hsextract.fingerprint`) to its request's
  fingerprint, and the chunk that ends at the prompt's last row records the token SGLang's greedy
  sampler picked: both go into ``done.json``, for the drain to check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hsextract import fingerprint
from hsextract.layers import CaptureLayers
from hsextract.staging.dumps import (
    CAPTURE_MISSING_ROWS,
    CAPTURE_SERVER_ABORTED,
    STAGED_PRECISIONS,
    DoneMarker,
    StateFileLayout,
)
from hsextract.staging.records import parse_rid

log = logging.getLogger("hsextract.capture")


@dataclass(frozen=True)
class CaptureSettings:
    """What the capture writes and how it describes it in ``done.json``."""

    rid_prefix: str
    layers: CaptureLayers
    hidden_size: int
    dtype: str = "bfloat16"
    final_hidden: str = "post_norm"
    architecture: str = ""
    model_path: str = ""
    sglang_version: str = ""
    hsextract_version: str = ""
    attn_dp_rank: int = 0
    max_tracked: int = 4096
    # How the rows are staged: "bf16" as computed (in `dtype`), or "fp8": quantized on the device before
    # the copy to the host (hsextract.fp8; the staged file: hsextract.staging.dumps).
    precision: str = "bf16"

    def __post_init__(self) -> None:
        if self.precision not in STAGED_PRECISIONS:
            raise ValueError(f"capture precision {self.precision!r}: expected one of {', '.join(STAGED_PRECISIONS)}")

    def layout(self, prompt_len: int) -> StateFileLayout:
        """The staged file of a request of `prompt_len` tokens."""
        return StateFileLayout(prompt_len, self.num_slots, self.hidden_size, self.dtype, self.precision)

    @property
    def num_aux(self) -> int:
        return len(self.layers.sglang_layers_to_capture)

    @property
    def num_slots(self) -> int:
        """Rows per token in the staged file: the aux layers, then the final hidden state."""
        return self.num_aux + 1

    def wants(self, rid: object) -> bool:
        """True for the ids this prefix's clients make (`hsextract.staging.records.make_rid` and
        `make_probe_rid`); False for everything else. The rid becomes a directory name in the staging
        directory, and anyone who can POST to the server chooses it: an id of any other form (a
        ``/``, a ``..``) is never written."""
        return isinstance(rid, str) and rid.startswith(self.rid_prefix + "-") and _is_client_rid(rid, self.rid_prefix)


def _is_client_rid(rid: str, prefix: str) -> bool:
    parsed = parse_rid(rid)
    return parsed is not None and parsed.prefix == prefix


_REFUSED_LOG_LIMIT = 100  # distinct refused rids logged; whoever sends them must not fill the log
_refused_logged: set[str] = set()


def _log_refused(rid: str, prefix: str) -> None:
    """Say once per rid why a request that carries the run's prefix is not captured (the first
    `_REFUSED_LOG_LIMIT` of them; then once that no more are logged)."""
    if rid in _refused_logged or len(_refused_logged) > _REFUSED_LOG_LIMIT:
        return
    _refused_logged.add(rid)
    if len(_refused_logged) > _REFUSED_LOG_LIMIT:
        log.warning(
            "capture: more than %d requests with malformed ids of prefix %r; no more are logged",
            _REFUSED_LOG_LIMIT,
            prefix,
        )
        return
    log.warning(
        "capture: request id %r is not captured: it starts with the run's prefix but is not of the form "
        "<prefix>-<run id>-<index> (run id 8-32 lower-case hex, index decimal or p<hex>) that the client "
        "sends, and the capture writes only those into the staging directory",
        rid,
    )


@dataclass(frozen=True)
class BatchRequest:
    """One request's rows inside a forward batch (known on the CPU during the forward)."""

    rid: str
    batch_row: int  # first row of this request in the batch
    prefix_len: int  # tokens already in the KV cache before this forward
    extend_len: int  # rows this forward computes for the request
    index: int  # position of the request in the batch (to find its prompt length)


def select_requests(
    rids: Sequence[object] | None,
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
    settings: CaptureSettings,
) -> list[BatchRequest]:
    """The requests of an extend batch that belong to this run, with their row offsets.

    Called inside the forward pass for every extend batch, so it only touches CPU lists.
    """
    if not rids:
        return []
    out: list[BatchRequest] = []
    row = 0
    for i, rid in enumerate(rids):
        n = int(extend_lens[i])
        if n > 0 and settings.wants(rid):
            out.append(BatchRequest(str(rid), row, int(prefix_lens[i]), n, i))
        elif n > 0 and isinstance(rid, str) and rid.startswith(settings.rid_prefix + "-"):
            _log_refused(rid, settings.rid_prefix)
        row += n
    return out


@dataclass(frozen=True)
class LandedMeta:
    """What a batch's host copy says besides its rows, each indexed as SGLang's batch is: prompt
    lengths and greedy tokens by request (`BatchRequest.index`), ids and fingerprint values by row
    (`BatchRequest.batch_row` onwards). Only the prompt lengths are required."""

    prompt_lens: Sequence[int]
    ids: Sequence[int] | np.ndarray | None = None
    row_values: Sequence[int] | np.ndarray | None = None  # int64 per row: hsextract.fingerprint.row_values
    greedy_tokens: Sequence[int] | None = None  # -1 where unknown


ABORT_PLACEHOLDER_ID = 0  # the one token SGLang runs in place of a request it refused (0.5.23)


def is_abort_placeholder(prompt_len: int, first_id: int | None) -> bool:
    """Is this SGLang's stand-in for a request it refused at validation (a prompt longer than it
    accepts, say)? ``Req.set_finish_with_abort`` replaces the prompt with the single token 0 and
    runs it to finish the request. The client never sends a 1-token prompt (a chat template alone
    is longer), so a 1-token prompt of id 0 is that stand-in, never a sample."""
    return prompt_len == 1 and first_id == ABORT_PLACEHOLDER_ID


@dataclass
class RequestState:
    """What the capture knows about one request while (and after) it is staged."""

    rid: str
    layout: StateFileLayout
    covered: list[list[int]] = field(default_factory=list)  # sorted, merged [start, end) row ranges
    chunks: list[list[int]] = field(default_factory=list)  # [[prefix_len, rows], ...] in arrival order
    complete: bool = False  # all rows planned; no later forward may touch the dump
    marker: DoneMarker | None = None  # written once every planned row is on disk
    # Accounting of the writes in flight, updated by the writer threads under `lock`.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    pending: int = 0
    failed: str = ""  # why the capture gave up on it (first error); a failed dump is never marked done
    reported: bool = False  # its failure marker is written (once)
    done_written: bool = False
    fingerprint: int = 0  # the sum of its planned chunks' partial fingerprints
    greedy_token: int = -1

    @property
    def prompt_len(self) -> int:
        return self.layout.prompt_len


@dataclass(frozen=True)
class Failure:
    """A request the capture gave up on: the writer leaves ``failed.json`` with this reason."""

    rid: str
    reason: str
    detail: str


@dataclass(frozen=True)
class Segment:
    """A contiguous run of rows to write: batch rows -> rows of one request's file."""

    state: RequestState
    batch_row: int
    dst_row: int
    rows: int
    create: bool  # first rows of this request: (re)create the file at full size first


def add_range(covered: list[list[int]], start: int, end: int) -> list[list[int]]:
    """Merge ``[start, end)`` into sorted, disjoint ranges (touching ranges merge)."""
    merged: list[list[int]] = []
    placed = False
    for s, e in covered:
        if e < start:
            merged.append([s, e])
        elif end < s:
            if not placed:
                merged.append([start, end])
                placed = True
            merged.append([s, e])
        else:
            start, end = min(s, start), max(e, end)
    if not placed:
        merged.append([start, end])
    merged.sort()
    return merged


class CapturePlanner:
    """Turns batches into write segments and decides completion (one thread calls it)."""

    def __init__(self, settings: CaptureSettings, is_staged: Callable[[str], bool] | None = None):
        """``is_staged(rid)`` tells whether a complete dump of ``rid`` is still in the staging
        directory (the writer checks for its done marker); without it, dumps count as staged."""
        self.settings = settings
        self.is_staged = is_staged or (lambda rid: True)
        self._tracked: OrderedDict[str, RequestState] = OrderedDict()
        self.evicted_incomplete = 0
        self.skipped_partial = 0
        self.restarted = 0  # incomplete requests sent again from row 0: their dumps started anew
        self._failures: list[Failure] = []  # found while planning, for the writer to report

    def __len__(self) -> int:
        return len(self._tracked)

    def get(self, rid: str) -> RequestState | None:
        return self._tracked.get(rid)

    def take_failures(self) -> list[Failure]:
        """The requests found unstageable since the last call (the writer marks them failed)."""
        out, self._failures = self._failures, []
        return out

    def fail(self, rid: str, reason: str) -> RequestState:
        """Mark `rid` failed (creating a placeholder if it is not tracked), so that later chunks
        of it are ignored until it is sent again from row 0."""
        state = self._tracked.get(rid)
        if state is None:
            state = RequestState(rid, self.settings.layout(0))
            self._track(state)
        with state.lock:
            if not state.failed:
                state.failed = reason
        return state

    def plan(self, requests: Sequence[BatchRequest], meta: LandedMeta | Sequence[int]) -> list[Segment]:
        """Segments for the selected requests of one batch; ``meta`` (or the prompt lengths alone,
        SGLang's ``orig_seq_lens``) as `LandedMeta` says."""
        if not isinstance(meta, LandedMeta):
            meta = LandedMeta(prompt_lens=meta)
        segments: list[Segment] = []
        for req in requests:
            first_id = None if meta.ids is None else int(meta.ids[req.batch_row])
            seg = self._plan_one(req, int(meta.prompt_lens[req.index]), first_id)
            if seg is not None:
                self._note_content(seg, req, meta)
                segments.append(seg)
        return segments

    @staticmethod
    def _note_content(seg: Segment, req: BatchRequest, meta: LandedMeta) -> None:
        """Add the segment's rows to its request's fingerprint, and its greedy token when the
        segment ends the prompt; then the marker of a completed request carries both."""
        state = seg.state
        if meta.row_values is not None:
            values = meta.row_values[seg.batch_row : seg.batch_row + seg.rows]
            state.fingerprint = fingerprint.add(state.fingerprint, fingerprint.combine(values, seg.dst_row))
        if meta.greedy_tokens is not None and seg.dst_row + seg.rows == state.prompt_len:
            state.greedy_token = int(meta.greedy_tokens[req.index])
        if state.marker is not None:
            state.marker.fingerprint = fingerprint.to_text(state.fingerprint) if meta.row_values is not None else ""
            state.marker.greedy_token = state.greedy_token

    def _plan_one(self, req: BatchRequest, prompt_len: int, first_id: int | None = None) -> Segment | None:
        state = self._tracked.get(req.rid)
        create = False
        if state is not None:
            self._tracked.move_to_end(req.rid)
            planned, state = self._follow(state, req, prompt_len)
            if not planned:
                return None
        if state is None:
            state = self._start(req, prompt_len, first_id)
            if state is None:
                return None
            create = True
        start = req.prefix_len
        end = min(req.prefix_len + req.extend_len, state.prompt_len)
        if start >= end:
            return None  # rows past the prompt: decode steps
        state.covered = add_range(state.covered, start, end)
        state.chunks.append([start, end - start])
        with state.lock:
            state.pending += 1
        if state.covered == [[0, state.prompt_len]]:
            state.complete = True
            state.marker = self._marker(state)
        return Segment(state, req.batch_row + 0, start, end - start, create)

    def _start(self, req: BatchRequest, prompt_len: int, first_id: int | None = None) -> RequestState | None:
        """Track a request seen for the first time, if its dump can be complete."""
        if prompt_len <= 0 or req.prefix_len >= prompt_len:
            return None  # decode rows of a request the capture is not tracking
        if req.prefix_len == 0 and is_abort_placeholder(prompt_len, first_id):
            detail = (
                "SGLang refused this request before running it and ran a 1-token placeholder in its place; "
                "the server's reply to the request (and its log) says why"
            )
            log.warning("rid %s: %s; it is marked failed", req.rid, detail)
            self.fail(req.rid, CAPTURE_SERVER_ABORTED)
            self._failures.append(Failure(req.rid, CAPTURE_SERVER_ABORTED, detail))
            return None
        if req.prefix_len > 0:
            # Either its first rows came from a prefix cache, or this is a decode/re-prefill row
            # of a request no longer tracked: no complete dump can come of it, write nothing.
            self.skipped_partial += 1
            detail = (
                f"the first forward seen starts at row {req.prefix_len} of {prompt_len}, not 0 (a cached "
                "prefix, or a request dropped from tracking); the server must run with --disable-radix-cache"
            )
            log.warning("rid %s: %s; it is marked failed", req.rid, detail)
            self.fail(req.rid, CAPTURE_MISSING_ROWS)
            self._failures.append(Failure(req.rid, CAPTURE_MISSING_ROWS, detail))
            return None
        state = RequestState(req.rid, self.settings.layout(prompt_len))
        self._track(state)
        return state

    def _follow(self, state: RequestState, req: BatchRequest, prompt_len: int) -> tuple[bool, RequestState | None]:
        """A chunk of a tracked request: whether it is planned, and the state it adds to (None: a
        new dump, the old state dropped)."""
        if state.failed and not state.complete:
            if req.prefix_len != 0 or not self._settled(state):
                return False, None  # a later chunk of a failed request: its dump can never complete
            del self._tracked[req.rid]  # sent again from row 0: a new dump
            return True, None
        if state.complete and self._is_resend(state, req, prompt_len):
            del self._tracked[req.rid]
            return True, None
        if state.complete:
            log.debug(
                "rid %s: already complete, ignoring a later forward (prefix %d, %d rows)",
                req.rid,
                req.prefix_len,
                req.extend_len,
            )
            return False, None
        if req.prefix_len == 0:
            return self._restart(state, prompt_len), None
        return True, state

    def _restart(self, state: RequestState, prompt_len: int) -> bool:
        """A tracked request, neither complete nor failed, comes again from row 0: an earlier send
        that the server aborted midway (its client died: SGLang drops the request and the capture
        is not told), sent again under the same rid. Its dump starts anew (True), so that the
        aborted send's rows and fingerprint are not mixed into it; while the aborted send's writes
        are still in flight they would race the new ones into one file, so the request is failed
        instead (False) and the client sends it once more."""
        if self._settled(state):
            log.info(
                "rid %s: sent again from row 0 after %d of its %d rows were seen (the server aborted the "
                "earlier send?); its dump starts anew",
                state.rid,
                sum(e - s for s, e in state.covered),
                state.prompt_len,
            )
            self.restarted += 1
            del self._tracked[state.rid]
            return True
        detail = (
            f"sent again from row 0 (prompt of {prompt_len} rows) while the writes of an earlier send of the "
            "same rid were still in flight; the client sends it again"
        )
        log.warning("rid %s: %s; it is marked failed", state.rid, detail)
        self.fail(state.rid, CAPTURE_MISSING_ROWS)
        self._failures.append(Failure(state.rid, CAPTURE_MISSING_ROWS, detail))
        return False

    @staticmethod
    def _settled(state: RequestState) -> bool:
        """No write of the request's old dump is still in flight."""
        with state.lock:
            return state.pending == 0

    def _is_resend(self, state: RequestState, req: BatchRequest, prompt_len: int) -> bool:
        """A complete rid that starts again from row 0 with the same prompt length, after its
        dump left the staging directory (drained or quarantined), is the client sending the
        sample again: capture it anew. A re-prefill after retraction carries the generated
        tokens too (a longer sequence), and a dump still staged is already there: both ignored."""
        with state.lock:
            settled = state.done_written or (bool(state.failed) and state.pending == 0)  # no old write in flight
        return req.prefix_len == 0 and prompt_len == state.prompt_len and settled and not self.is_staged(state.rid)

    def _marker(self, state: RequestState) -> DoneMarker:
        s = self.settings
        return DoneMarker(
            rid=state.rid,
            prompt_len=state.prompt_len,
            num_aux=s.num_aux,
            hidden_size=s.hidden_size,
            dtype=s.dtype,
            eagle_aux_hidden_state_layer_ids=list(s.layers.eagle_aux_hidden_state_layer_ids),
            sglang_layers_to_capture=list(s.layers.sglang_layers_to_capture),
            num_hidden_layers=s.layers.num_hidden_layers,
            final_hidden=s.final_hidden,
            architecture=s.architecture,
            chunks=[list(c) for c in state.chunks],
            model_path=s.model_path,
            sglang_version=s.sglang_version,
            hsextract_version=s.hsextract_version,
            attn_dp_rank=s.attn_dp_rank,
            completed_at=time.time(),
            precision=s.precision,
        )

    def _track(self, state: RequestState) -> None:
        self._tracked[state.rid] = state
        while len(self._tracked) > self.settings.max_tracked:
            rid, old = self._tracked.popitem(last=False)
            if not old.complete and not old.failed:
                self.evicted_incomplete += 1
                detail = (
                    f"dropped from tracking before it was complete ({sum(e - s for s, e in old.covered)} of "
                    f"{old.prompt_len} rows): more than {self.settings.max_tracked} requests in progress"
                )
                log.warning("rid %s: %s; it is marked failed", rid, detail)
                with old.lock:
                    old.failed = CAPTURE_MISSING_ROWS
                self._failures.append(Failure(rid, CAPTURE_MISSING_ROWS, detail))
