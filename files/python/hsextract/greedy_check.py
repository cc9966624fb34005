"""Does a captured final hidden state give the token the server's greedy sampler picked?

The end-to-end check of a sample's content: the final hidden state of the prompt's last position,
through the final RMSNorm where it is stored pre-norm, then through the model's own ``lm_head``,
must have its argmax at the token SGLang sampled (temperature 0). Wrong rows (another batch's,
another layer's, another position's) fail it, though not every wrong row does: a scale, or a
layer close to the last, can keep the argmax. The logprob check (`hsextract.logprob_check`)
compares whole distributions in the same pass over the head (`GreedyHead.scan` hands each chunk's
logits to both). Used by the smoke test on its probe and by the drain on a share of real samples.

Several samples share one pass (`GreedyHead.check_many`): each chunk of the head is read once and
multiplied by every sample's rows at once, so a pass for 32 samples' last rows costs what a pass for
one does (bench/selfcheck_cost.py, an 8B-shaped head on 2 cores: 1.58 s against 1.63 s). The matrix
product grows with the rows (a 64 MiB chunk times 1 row 6 ms, 16 rows 9 ms, 64 rows 24 ms, 256 rows
84 ms), which the drain bounds (hsextract.drain.check_queue.PASS_ROWS). The drain's self-check
batches the samples waiting for it this way (hsextract.drain.check_queue). A head given `threads`
reads and multiplies that many chunks at once, in order of their results, so one pass runs on as
many cores.

Memory and time: only the two weights needed are read, by name, from the model's safetensors
files, and ``lm_head`` is read with plain reads in chunks of rows (a 160K x 7168 head is 2.3 GB in
bf16; a chunk is 64 MiB by default; nothing is mapped), so a check runs on a CPU beside the drain
for a 1T-parameter model. Each chunk's logits are computed in the head's own dtype (bf16: 15x faster
than converting the chunk to float32 on a CPU) to find the best few candidates; the logits of
those candidates and of the server's token are then recomputed in float32 from their rows. The
float32 argmax is among the candidates unless more than `CANDIDATES` tokens tie within bf16's
rounding, and a missed one could only make the check more lenient, never fail a right sample.
``bench/selfcheck_cost.py`` measures it.

Tolerance (bf16 ties): the server's logits come from a bf16 matmul, ours from float32 over the
bf16-rounded hidden state. The check passes when our argmax is the server's token, or when the
server's token is within ``2**-7 * max(1, |top logit|)`` (one bf16 ulp, relative) of our top
logit; such a near-tie pass is reported.

FP8 rows (a set stored in FP8, hsextract.fp8) are checked as the trainer reads them, dequantized:
each value then differs from the server's by up to half an e4m3 step (2**-4 of its token's
largest value), which moves the logits far more than bf16's rounding. Measured on the suite's tiny
Llama (transformers' rows of 20 prompts of 3 to 300 tokens as the pre-norm capture stages them,
every position; tests/drain/test_fp8_selfcheck.py): the gap of any token to the argmax moved by up
to 0.096 of the top logit, against 2**-7 = 0.0078 for bf16. So FP8 rows pass within
`FP8_REL_TIE` = 2**-3 (one e4m3 step) of the top logit: a near tie then, never a false
``greedy_mismatch``. It makes the greedy check more lenient (rows of the layer before fail it on 13
of those 20 prompts with bf16's tie, on 11 with FP8's): the logprob check, whose bound FP8's error
(0.026-0.027 against the real server) leaves far from, is what catches those (0.37-0.53).
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hsextract.errors import ConfigError
from hsextract.model_weights import DEFAULT_RMS_NORM_EPS, PREFIXES, read_header, rms_norm, weight_map

BF16_REL_TIE = 2.0**-7
FP8_REL_TIE = 2.0**-3  # rows stored as FP8 and checked dequantized (the module docstring)
DEFAULT_CHUNK_BYTES = 64 << 20
CANDIDATES = 16
_ST_DTYPES = {"BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2), "F32": (torch.float32, 4)}


# Sees each chunk of the head's logits in one pass: (the chunk's first vocabulary id, float32 logits [n, rows]).
ChunkConsumer = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class HeadQuery:
    """One sample's rows for a pass over the head: its final hidden states ``rows`` ``[n, H]`` (as
    the dump stores them), the last of which must give ``token``; the consumers ``also`` see every
    chunk's logits of all ``n`` rows (the logprob check, `hsextract.logprob_check`)."""

    rows: torch.Tensor
    final_hidden: str
    token: int
    also: Sequence[ChunkConsumer] = ()
    tie: float = BF16_REL_TIE  # the relative tolerance of a near tie: FP8_REL_TIE for dequantized FP8 rows


@dataclass(frozen=True)
class GreedyVerdict:
    ok: bool
    predicted: int  # our argmax
    token: int  # the server's token
    logit_gap: float  # our top logit minus the server token's logit
    tolerance: float
    near_tie: bool = False

    def explain(self) -> str:
        return (
            f"the captured final hidden state of the last position predicts token {self.predicted}, but the "
            f"server's greedy sampler picked {self.token} (logit gap {self.logit_gap:.4g} > tolerance "
            f"{self.tolerance:.4g}): the dump does not hold the states the server computed (wrong rows, layer "
            "or norm placement)"
        )


class _Rows:
    """Rows of a tensor in a safetensors file (a 1-D one is one row), read with pread: no mapping,
    no whole load."""

    def __init__(self, path: Path, name: str):
        header, start = read_header(path)
        meta = header[name]
        shape = list(meta["shape"])
        if meta["dtype"] not in _ST_DTYPES or len(shape) not in (1, 2):
            raise ConfigError(
                f"greedy self-check: {name} in {path} is {meta['dtype']} {shape}; a 1-D or 2-D "
                f"tensor of {', '.join(_ST_DTYPES)} is needed"
            )
        self.path, self.dtype, self.elem = path, *_ST_DTYPES[meta["dtype"]]
        self.rows, self.width = [1, *shape][-2:]
        self.offset = start + meta["data_offsets"][0]

    def read(self, fd: int, first: int, count: int) -> torch.Tensor:
        row_bytes = self.width * self.elem
        buf = bytearray(count * row_bytes)
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = os.preadv(fd, [view[got:]], self.offset + first * row_bytes + got)
            if n <= 0:
                raise ConfigError(f"greedy self-check: {self.path} is shorter than its header says")
            got += n
        return torch.frombuffer(buf, dtype=self.dtype).view(count, self.width)


class GreedyHead:
    """The model's ``lm_head`` and final norm, read lazily and in chunks; the checks are thread-safe.
    With ``threads`` above 1, a pass reads and multiplies that many chunks at once."""

    def __init__(self, model_path: str | Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES, threads: int = 1):
        self.model_path = Path(model_path)
        try:
            config: dict[str, Any] = json.loads((self.model_path / "config.json").read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"greedy self-check: cannot read {self.model_path / 'config.json'}: {exc}") from exc
        text = config.get("text_config") or config
        self.eps = float(text.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS))
        tied = bool(config.get("tie_word_embeddings") or text.get("tie_word_embeddings"))
        names = weight_map(self.model_path)
        heads = [f"{p}lm_head.weight" for p in PREFIXES] + (
            [f"{p}model.embed_tokens.weight" for p in PREFIXES] if tied else []
        )
        self.head_name = next((n for n in heads if n in names), "")
        if not self.head_name:
            raise ConfigError(f"greedy self-check: no lm_head weight in {self.model_path} (looked for {heads[0]})")
        self.head_file = names[self.head_name]
        self._head = _Rows(self.head_file, self.head_name)
        self.norm_name = next((n for n in (f"{p}model.norm.weight" for p in PREFIXES) if n in names), "")
        self.norm_file = names.get(self.norm_name)
        self.chunk_bytes = max(1, int(chunk_bytes))
        self._norm: torch.Tensor | None = None
        self._lock = threading.Lock()  # the final norm's weight is read once
        self.threads = max(1, int(threads))
        self._pool: ThreadPoolExecutor | None = None

    @property
    def vocab(self) -> int:
        """The head's rows: the model's vocabulary as the server computes its logits."""
        return self._head.rows

    def _norm_weight(self) -> torch.Tensor:
        with self._lock:
            return self._read_norm()

    def _read_norm(self) -> torch.Tensor:
        if self._norm is None:
            if self.norm_file is None:
                raise ConfigError(
                    f"greedy self-check: the dump is pre-norm but {self.model_path} has no final norm "
                    "weight (model.norm.weight)"
                )
            norm = _Rows(self.norm_file, self.norm_name)
            fd = os.open(self.norm_file, os.O_RDONLY)
            try:
                self._norm = norm.read(fd, 0, 1)[0].float()
            finally:
                os.close(fd)
        return self._norm

    def final_states(self, rows: torch.Tensor, final_hidden: str) -> torch.Tensor:
        """The rows ``[n, H]`` as the head sees them, in float32: through the final RMSNorm where
        the dump stores them pre-norm."""
        h = rows.float()
        if final_hidden == "pre_norm":
            h = rms_norm(h, self._norm_weight(), self.eps)
        return h

    def scan(self, fd: int, h_low: torch.Tensor, consumers: Sequence[ChunkConsumer]) -> None:
        """One pass over the head: each chunk's logits of the rows ``h_low`` ``[n, H]`` (in the
        head's own dtype, as the server computes them, then float32: ``[n, chunk rows]``) go to
        every consumer with the chunk's first vocabulary id, chunk after chunk in order."""
        head = self._head
        if head.width != h_low.shape[-1]:
            raise ConfigError(
                f"greedy self-check: lm_head is {head.rows} x {head.width}, the dump's hidden size is {h_low.shape[-1]}"
            )
        rows = max(1, self.chunk_bytes // (head.width * head.elem))

        def logits(first: int) -> torch.Tensor:
            return (h_low @ head.read(fd, first, min(rows, head.rows - first)).T).float()

        for first, chunk in self._in_order(logits, range(0, head.rows, rows)):
            for consume in consumers:
                consume(first, chunk)

    def _in_order(self, compute: Callable[[int], torch.Tensor], firsts: range) -> Iterator[tuple[int, torch.Tensor]]:
        """``compute`` of each first row, in order: on the calling thread, or with `threads` chunks
        under way at once (at most twice that many done and waiting, so the memory stays bounded)."""
        if self.threads == 1:
            yield from ((a, compute(a)) for a in firsts)
            return
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="head-pass")
        under_way: deque[tuple[int, Future]] = deque()
        for a in firsts:
            under_way.append((a, self._pool.submit(compute, a)))
            if len(under_way) >= 2 * self.threads:
                first, done = under_way.popleft()
                yield first, done.result()
        while under_way:
            first, done = under_way.popleft()
            yield first, done.result()

    def check_many(self, queries: Sequence[HeadQuery]) -> list[GreedyVerdict]:
        """The verdict on each query's last row against its token, all from one pass over the head
        (each query's consumers ``also`` see its own rows' logits)."""
        if not queries:
            return []
        states = [self.final_states(q.rows, q.final_hidden) for q in queries]
        candidates = [_Candidates() for _ in queries]
        consumers: list[ChunkConsumer] = []
        at = 0
        for q, h, cands in zip(queries, states, candidates, strict=True):
            rows = slice(at, at + h.shape[0])
            mine: list[ChunkConsumer] = [cands, *q.also]
            consumers += [_rows_of(c, rows) for c in mine]
            at = rows.stop
        fd = os.open(self._head.path, os.O_RDONLY)
        try:
            self.scan(fd, torch.cat(states).to(self._head.dtype), consumers)
            return [
                _verdict(*cands.exact(self._head, fd, h[-1], q.token), q.token, q.tie)
                for q, h, cands in zip(queries, states, candidates, strict=True)
            ]
        finally:
            os.close(fd)

    def check_rows(
        self, rows: torch.Tensor, final_hidden: str, token: int, also: Sequence[ChunkConsumer] = ()
    ) -> GreedyVerdict:
        """The verdict on the last of ``rows`` (``[n, H]``, a sample's final hidden states) against
        the server's token; in the same pass over the head, the consumers ``also`` see every chunk's
        logits of all ``n`` rows (the logprob check, `hsextract.logprob_check`)."""
        return self.check_many([HeadQuery(rows, final_hidden, token, also)])[0]

    def check(self, final_row: torch.Tensor, final_hidden: str, token: int) -> GreedyVerdict:
        """The verdict on one sample's last final hidden state (``[H]``) against the server's token."""
        return self.check_rows(final_row.reshape(1, -1), final_hidden, token)

    def close(self) -> None:
        """End the pass's threads (a head with `threads` above 1; idle ones end at exit anyway)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def _rows_of(consume: ChunkConsumer, rows: slice) -> ChunkConsumer:
    """`consume`, fed only the logits of ``rows`` (one query's, in a pass for several)."""
    return lambda first, logits: consume(first, logits[rows])


def _verdict(top: int, top_logit: float, token_logit: float, token: int, tie: float = BF16_REL_TIE) -> GreedyVerdict:
    """Our argmax against the server's token, within `tie` of the top logit (one bf16 ulp, relative;
    FP8 rows: the module docstring)."""
    gap = top_logit - token_logit if token_logit == token_logit else float("inf")
    tol = tie * max(1.0, abs(top_logit))
    if top == token:
        return GreedyVerdict(True, top, token, 0.0, tol)
    return GreedyVerdict(gap <= tol, top, token, gap, tol, near_tie=gap <= tol)


class _Candidates:
    """The last row's best `CANDIDATES` logits over the head's chunks (in the head's dtype), then
    their logits, and the server token's, again in float32 from their rows (see the module docstring)."""

    def __init__(self) -> None:
        self.vals = torch.empty(0)
        self.idx = torch.empty(0, dtype=torch.int64)

    def __call__(self, first: int, logits: torch.Tensor) -> None:
        last = logits[-1]
        vals, idx = torch.topk(last, min(CANDIDATES, last.numel()))
        self.vals = torch.cat([self.vals, vals])
        self.idx = torch.cat([self.idx, idx + first])
        if self.vals.numel() > CANDIDATES:
            keep = torch.topk(self.vals, CANDIDATES).indices
            self.vals, self.idx = self.vals[keep], self.idx[keep]

    def exact(self, head: _Rows, fd: int, h32: torch.Tensor, token: int) -> tuple[int, float, float]:
        """(argmax, its logit, the logit of ``token``), in float32."""
        exact = {int(i): float(head.read(fd, int(i), 1)[0].float() @ h32) for i in self.idx}
        if 0 <= token < head.rows and token not in exact:
            exact[token] = float(head.read(fd, token, 1)[0].float() @ h32)
        candidates = set(self.idx.tolist())
        top = max((i for i in exact if i in candidates), key=lambda i: exact[i])
        return top, exact[top], exact.get(token, float("nan"))
