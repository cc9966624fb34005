"""The product end to end on a GPU: `hsextract extract` and `hsextract drain` as the units run them,
against a capture server at SGLang's production defaults, on a dataset of realistic varied lengths,
with every sample validated.

What runs, for each model (``--models``: the 8B-shaped Llama and the tiny DeepSeek-V3):

1. servers on the chosen GPUs: a capture server at SGLang's defaults (the overlap scheduler on),
   the same with ``--disable-overlap-schedule``, and a plain server (no capture patch), with the
   parallelism of ``--tp`` / ``--dp-attention``;
2. a generated dataset: conversations of 1 to 3 turns, message lengths drawn from an exponential
   distribution, a share of long ones (several chunks of chunked prefill) and, where the model's
   context allows, a few of 16K-30K tokens;
3. ``correctness``: the real client and drain, as two processes, at each ``--in-flight`` bound
   (the default 32 first) on the overlap server, then at the default on the no-overlap server. The
   drain validates every sample (ids against the client's record, the forward pass's fingerprint,
   finite values, the greedy and the logprob self-check on a share, the drain asking the server for
   the prompts' logprobs as its unit does; the check's numbers are in each run's ``selfcheck``) and
   its run check must pass: the accounts
   reconcile with 0 failed and 0 quarantined. The rows of the overlap run are then compared, sample
   by sample, with the no-overlap run's, and a few samples with transformers;
4. ``throughput`` (``--rounds`` > 0; ``--correctness-models`` to skip step 3 for a model): rounds in a rotating
   order of a plain asyncio loop sending the same encoded prompts to the plain server, of the same
   loop against the overlap and the no-overlap capture servers (a stand-in drain checks each dump's
   ids and fingerprint: what the capture and the overlap scheduler cost at the server), and of the
   whole pipeline on the overlap capture server: the client's own wall time, and the whole
   pipeline's (start of both processes to the drain's exit), the client's start-up, and the
   drain's GB/s beside the disk's own (``dd conv=fsync``);
5. ``tiny`` in ``--models``: the client's ceiling. A tiny Llama on the GPU answers almost at once, so
   the throughput rounds (short prompts, the plain loop against the plain and the capture server,
   and the product) measure how many samples a second one `hsextract extract` process sends, records
   and confirms, against the plain loop's rate.

    python3 bench/gpu/pipeline_gpu.py --bundle .gpu                    # on the GPU host
    python3 bench/gpu/pipeline_gpu.py --device cpu --samples 40        # dry run on a CPU (tiny models)
    python3 bench/gpu/pipeline_gpu.py --bundle .gpu --models tiny --correctness-models none --rounds 3

Results: ``pipeline_gpu.json`` in ``--results`` (bench/results on a GPU) and in ``$OUT`` where set.
Exits 0 only if every correctness run passed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "bench"), str(REPO / "files" / "python"), str(REPO / "tests")]

import gpu_env  # noqa: E402
from gpu_server import ServerHandle, ServerSpec, start, wait_healthy  # noqa: E402

SITE = Path("/tmp/hsx-gpu-site")
FORMAT = "specforge"  # the project's default format (the capture patch's default final-norm placement)
PORT = 30400
MODEL_KINDS = ("llama8b", "dsv3", "tiny")
DEFAULT_MODELS = "llama8b,dsv3"  # "tiny": the client's ceiling (a tiny Llama on the GPU answers at once)
# "pipeline_drain_first": the drain started first and up (its worker processes too) before the client starts, as
# the units run them (the drain's unit runs from the converge; the client's starts after the server's minutes of
# loading): the whole pipeline from the client's start, without the drain's own start-up.
# "client_alone": the client with no staging limit and the drain started after it: the client's own ceiling and the
# drain's, each apart from the other (the tiny model only: everything it sends stays staged until the drain runs)
ALL_SIDES = ("plain_loop", "loop_on_capture", "loop_on_capture_no_overlap", "pipeline", "pipeline_2_processes",
             "client_alone", "pipeline_drain_first")


@dataclass
class ModelPlan:
    """One model's servers and dataset shape."""

    kind: str
    path: Path
    context: int
    words: str  # "w" for the word tokenizer of the 8B model (w<id>), else English words
    chunk: int
    server_args: tuple[str, ...]
    servers: dict[str, ServerHandle] = field(default_factory=dict)
    sides: tuple[str, ...] = (*ALL_SIDES[:4], "pipeline_drain_first")  # the throughput rounds' sides
    samples: int = 0  # the throughput dataset's size (0: --samples)
    mean_words: int = 120
    long_prompts: bool = True


# ---- dataset ---------------------------------------------------------------------------------------
_TEXT = ("the capital city of france is paris hello world this is a tiny test model for sglang deep learning "
         "models produce hidden states at every layer we dump auxiliary during prefill to shared memory quick "
         "brown fox jumps over lazy dog user asks question and assistant answers it politely")
_ENGLISH = _TEXT.split()


def write_dataset(path: Path, n: int, context: int, words: str, seed: int = 0, mean_words: int = 120,
                  long_prompts: bool = True) -> dict:
    """``n`` conversations (1-3 turns) of varied lengths, with a share of long ones unless
    ``long_prompts`` is false; returns what was made (word counts)."""
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(100, 120_000)] if words == "w" else _ENGLISH
    budget = context - 64  # the chat template's tokens and the reply's

    def message(k: int) -> str:
        return " ".join(rng.choice(vocab) for _ in range(max(1, k)))

    lengths = []
    with path.open("w") as f:
        for i in range(n):
            turns = 1 + rng.randrange(3)
            sizes = [int(rng.expovariate(1 / mean_words)) + 2 for _ in range(2 * turns)]
            if long_prompts and i % 20 == 7:  # long: several chunks of the prefill
                sizes[0] = rng.randint(min(2_000, budget // 4), min(8_000, budget // 2))
            if i in (3, 11, 19) and budget >= 20_000:  # near the context
                sizes[0] = rng.randint(16_000, min(30_000, budget - sum(sizes[1:]) - 200))
            while sum(sizes) > budget - 20 * len(sizes):
                sizes[sizes.index(max(sizes))] //= 2
            msgs = [{"role": "user" if j % 2 == 0 else "assistant", "content": message(k)} for j, k in enumerate(sizes)]
            f.write(json.dumps({"messages": msgs}) + "\n")
            lengths.append(sum(sizes))
    lengths.sort()
    return {"samples": n, "words_total": sum(lengths), "words_min": lengths[0], "words_median": lengths[n // 2],
            "words_max": lengths[-1], "over_4096": sum(x > 4096 for x in lengths),
            "over_16000": sum(x > 16000 for x in lengths)}


def encode(dataset: Path, model: Path, max_tokens: int) -> list[list[int]]:
    """Every sample's ids, as the client's own encoder makes them (the samples it rejects, as too
    long for instance, are not sent by the client either)."""
    from hsextract.client.chat_template import Encoded, build_encoder
    from hsextract.client.dataset import Reject, read_dataset

    encoder = build_encoder(model, None, max_tokens, "truncate")
    out = []
    for item in read_dataset(dataset):
        enc = item if isinstance(item, Reject) else encoder.encode(item)
        if isinstance(enc, Encoded):
            out.append(enc.input_ids)
    return out


# ---- the product as the units run it ---------------------------------------------------------------
def product_env(env: gpu_env.GpuEnv) -> dict[str, str]:
    """The environment of `hsextract extract` and `hsextract drain`: the bundle's packages, no GPU."""
    run_env = env.server_env(())
    run_env["CUDA_VISIBLE_DEVICES"] = ""
    return run_env


class Periodic:
    """A daemon thread calling `tick` every `every_s` while its `with` block runs, and once more
    at the end when `tick_at_exit`."""

    tick_at_exit = False

    def __init__(self, every_s: float):
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self.tick_at_exit:
            self.tick()

    def _run(self) -> None:
        while True:
            self.tick()
            if self._stop.wait(self.every_s):
                return

    def tick(self) -> None:
        raise NotImplementedError


class Timeline(Periodic):
    """What the pipeline was doing every half second: the dumps staged, and the drain's own counters
    read from its metrics endpoint (written samples and bytes, dumps waiting, dumps in hand). It shows
    whether the drain fell behind the server steadily or started late, and what the tail after the
    client's end was made of."""

    FIELDS = ("t", "staged", "drain_samples", "drain_gb", "lag", "in_flight")

    def __init__(self, dump_dir: Path, metrics_port: int, t0: float, every_s: float = 0.5):
        super().__init__(every_s)
        self.dump_dir, self.url, self.t0 = Path(dump_dir), f"http://127.0.0.1:{metrics_port}/metrics", t0
        self.rows: list[tuple] = []

    def _metrics(self) -> dict[str, float]:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url, timeout=0.4) as r:
                text = r.read().decode()
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if line.startswith("hsextract_drain_") and "{" not in line:
                name, _, value = line.partition(" ")
                out[name.removeprefix("hsextract_drain_")] = float(value)
        return out

    def tick(self) -> None:
        try:
            staged = sum(1 for e in os.scandir(self.dump_dir) if not e.name.startswith(("_", ".")))
        except FileNotFoundError:
            staged = 0
        m = self._metrics()
        self.rows.append((round(time.monotonic() - self.t0, 2), staged, m.get("samples_total"),
                          round(m["bytes_total"] / 1e9, 3) if "bytes_total" in m else None, m.get("lag_dumps"),
                          m.get("in_flight")))

    def summary(self, client_done_s: float) -> dict:
        """The timeline, and the facts read from it: when the drain first answered and first wrote,
        the most dumps staged, and the backlog when the client finished."""
        answered = [r for r in self.rows if r[2] is not None]
        wrote = [r for r in answered if r[2] > 0]
        before_end = [r for r in answered if r[0] <= client_done_s]
        return {"fields": list(self.FIELDS), "rows": self.rows,
                "drain_answered_s": answered[0][0] if answered else None,
                "drain_first_write_s": wrote[0][0] if wrote else None,
                "max_staged": max((r[1] for r in self.rows), default=0),
                "staged_at_client_end": before_end[-1][1] if before_end else None,
                "drain_samples_at_client_end": before_end[-1][2] if before_end else None}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pipeline(env: gpu_env.GpuEnv, server: ServerHandle, model: Path, dataset: Path, out: Path, in_flight: int,
                 max_tokens: int, selfcheck_share: float = 0.05, processes: int = 1, drain_after: bool = False,
                 drain_first: bool = False, profile: Path | None = None, profile_drain: Path | None = None,
                 reap: bool = False) -> dict:
    """The drain and the client (``processes`` of them, each on its sub-shard, `--process j/P`),
    started together as separate processes; what they report, with a timeline of both. With
    ``drain_after`` the client runs alone without a staging limit (``--max-staged 0``) and the drain
    starts once it has finished. With ``drain_first`` the drain starts first, and the client (and the
    clock) once the drain is up with its worker processes. With ``profile``, py-spy samples the
    (first) client into that file (its raw format); with ``profile_drain``, the drain and its worker
    processes into that one. With ``reap``, each sample's file is deleted once the drain has
    recorded it (`OutputReaper`)."""
    shutil.rmtree(out, ignore_errors=True)
    logs = out.parent / f"{out.name}-logs"
    logs.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "hsextract"]
    metrics_port = free_port()
    drain_cmd = drain_command(py, server, model, out, selfcheck_share, metrics_port)
    if profile_drain is not None:
        drain_cmd = [str(SITE / "bin" / "py-spy"), "record", "-r", "50", "--nonblocking", "--subprocesses",
                     "--threads", "-f", "raw", "-o", str(profile_drain), "--", *drain_cmd]
    client_cmd = [*py, "extract", "--server", server.url, "--dataset", str(dataset), "--model", str(model),
                  "--dump-dir", str(server.dump_dir), "--output", str(out), "--format", FORMAT,
                  "--max-in-flight", str(in_flight), "--max-tokens", str(max_tokens), "--log-every", "5"]
    if drain_after:
        client_cmd += ["--max-staged", "0"]
    run_env = product_env(env)
    drain_up_s = None
    with contextlib.ExitStack() as stack:
        dlog = stack.enter_context(open(logs / "drain.log", "wb"))
        drain = None
        if drain_first:
            started = time.monotonic()
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
            wait_drain_up(drain, logs / "drain.log", metrics_port)
            drain_up_s = round(time.monotonic() - started, 2)
        t0 = time.monotonic()
        timeline = stack.enter_context(Timeline(server.dump_dir, metrics_port, t0))
        reaper = stack.enter_context(OutputReaper(out)) if reap else None
        if not drain_after and drain is None:
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
        clients = []
        for j in range(processes):
            extra = ["--process", f"{j}/{processes}"] if processes > 1 else []
            # Only the thread holding the GIL, without pausing the client (a blocking py-spy slowed it 6 times).
            spy = [] if profile is None or j else [str(SITE / "bin" / "py-spy"), "record", "-r", "100", "--nonblocking",
                                                   "--gil", "--threads", "-f", "raw", "-o", str(profile), "--"]
            with open(logs / f"client{j or ''}.log", "wb") as clog:
                clients.append(subprocess.Popen([*spy, *client_cmd, *extra], stdout=clog, stderr=subprocess.STDOUT,
                                                env=run_env))
        first_request = wait_first_record(server.dump_dir, clients[0], t0)
        client_rcs = [c.wait(timeout=1800) for c in clients]
        client_done = time.monotonic()
        if drain is None:
            drain = subprocess.Popen(drain_cmd, stdout=dlog, stderr=subprocess.STDOUT, env=run_env)
        drain_rc = drain.wait(timeout=1800)
    wall = time.monotonic() - t0
    client_rc = next((rc for rc in client_rcs if rc), 0)
    res = summarize(out, logs, client_rc, drain_rc, wall, client_done - t0, first_request)
    res["timeline"] = timeline.summary(client_done - t0)
    res["tail_s"] = round(wall - (client_done - t0), 2)
    if drain_up_s is not None:
        res["drain_up_before_client_s"] = drain_up_s
    if reaper is not None:
        res["reaped"] = {"files": reaper.files, "gb": round(reaper.bytes / 1e9, 3)}
    if drain_after:  # the drain's own pace over what the client staged (its start-up included)
        drain_s = wall - (client_done - t0)
        res["drain_alone_s"] = round(drain_s, 2)
        res["drain_alone_samples_per_s"] = round(res["samples"] / drain_s, 1) if drain_s > 0 else None
    return res


def drain_command(py: list[str], server: ServerHandle, model: Path, out: Path, selfcheck_share: float,
                  metrics_port: int | None) -> list[str]:
    """`hsextract drain` as its unit runs it: the self-check asks the server for the checked prompts' logprobs."""
    metrics = [] if metrics_port is None else ["--metrics-port", str(metrics_port)]
    return [*py, "drain", "--dump-dir", str(server.dump_dir), "--output", str(out), "--format", FORMAT,
            "--model", str(model), "--exit-when-done", "--selfcheck-share", str(selfcheck_share),
            "--selfcheck-server", server.url, *metrics]


def selfcheck_numbers(out: Path) -> dict:
    """The drain's self-check counts and the logprob check's errors (drain-status.json's ``selfcheck``),
    with ``logprob_done``: every greedy-checked sample's logprobs compared, none left undone."""
    from hsextract.layout import drain_status_path

    try:
        numbers = json.loads(drain_status_path(out).read_text()).get("selfcheck") or {}
    except (OSError, ValueError):
        numbers = {}
    logprob = numbers.get("logprob") or {}
    numbers["logprob_done"] = bool(logprob.get("compared")) and not logprob.get("not_done")
    return numbers


class OutputReaper(Periodic):
    """Deletes each sample's file once the drain has recorded it in the manifest (the line is
    appended after the file is durable, and the drain never opens it again): a run longer than
    the machine's memory and disk can hold (the 8B shape writes 26 MB a sample, 0.85 GB/s). The
    drain's work is unchanged; the training set ends as its manifest, without its files."""

    tick_at_exit = True

    def __init__(self, out: Path, every_s: float = 0.25):
        super().__init__(every_s)
        self.manifest, self.out = out / "manifest.jsonl", out
        self.files = self.bytes = 0
        self._offset = 0

    def tick(self) -> None:
        try:
            with open(self.manifest, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        whole = data[: data.rfind(b"\n") + 1]  # a line still being appended waits for the next look
        self._offset += len(whole)
        for line in whole.splitlines():
            entry = json.loads(line)
            with contextlib.suppress(FileNotFoundError):
                (self.out / entry["file"]).unlink()
                self.files += 1
                self.bytes += int(entry.get("bytes", 0))


def wait_drain_up(drain: subprocess.Popen, log_path: Path, metrics_port: int, timeout_s: float = 300) -> None:
    """Until the drain answers on its metrics port and, when its workers are processes, has logged
    them started: the state its unit is in long before a client's first request."""
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if drain.poll() is not None:
            raise RuntimeError(f"the drain exited ({drain.returncode}) before it was up: {tail(log_path)}")
        text = log_path.read_text(errors="replace")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=1).close()
            answering = True
        except OSError:
            answering = False
        if answering and ("workers in threads" in text or "worker processes started" in text):
            return
        time.sleep(0.1)
    drain.kill()
    raise RuntimeError(f"the drain was not up in {timeout_s:.0f} s: {tail(log_path)}")


def wait_first_record(dump_dir: Path, client: subprocess.Popen, t0: float) -> float | None:
    """Seconds from the start until the client wrote its first sample's record (just before it sends it)."""
    records = Path(dump_dir) / "_records"
    since = time.time() - (time.monotonic() - t0)  # an earlier run's records on the same server are not this one's
    while client.poll() is None:
        try:
            if any(True for p in os.scandir(records) if "-p" not in p.name and p.stat().st_mtime >= since):
                return round(time.monotonic() - t0, 2)
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return None


def summarize(out: Path, logs: Path, client_rc: int, drain_rc: int, wall: float, client_wall: float,
              first_request: float | None) -> dict:
    from hsextract.formats.manifest import iter_entries
    from hsextract.layout import CLIENT_SUMMARY, client_files
    from hsextract.reconcile import read_accounts

    summaries = [json.loads(p.read_text()) for p in client_files(out, CLIENT_SUMMARY).values()]
    summary = combine_summaries(summaries)
    accounts = read_accounts(out, out / "quarantine", final=True)
    entries = list(iter_entries(out))
    quarantined = sorted(p.name for p in (out / "quarantine").iterdir()) if (out / "quarantine").is_dir() else []
    reasons: dict[str, int] = {}
    for name in quarantined:
        reason_file = out / "quarantine" / name / "reason.txt"
        reason = reason_file.read_text().splitlines()[0] if reason_file.exists() else "?"
        reasons[reason] = reasons.get(reason, 0) + 1
    tokens = sum(e.tokens for e in entries)
    nbytes = sum(e.bytes for e in entries)
    acc = accounts.as_dict() if accounts else {}
    ok = (client_rc == 0 and drain_rc == 0 and not quarantined and not acc.get("failed") and not acc.get("quarantined")
          and not acc.get("unaccounted") and acc.get("in_set") == acc.get("accepted") and bool(entries))
    return {
        "ok": ok, "client_rc": client_rc, "drain_rc": drain_rc, "samples": len(entries), "tokens": tokens,
        "gb": round(nbytes / 1e9, 3), "accounts": acc, "quarantined_by_reason": reasons,
        "selfchecked": sum(1 for e in entries if e.greedy_check),
        "selfcheck": selfcheck_numbers(out),
        "fingerprinted": sum(1 for e in entries if e.fingerprint),
        "client_summary": {k: summary.get(k) for k in ("ok", "failed", "retried", "truncated", "tokens", "wall_s",
                                                       "startup_s")},  # startup_s: the client's own phases
        "client_tokens_per_s": round(summary["tokens"] / summary["wall_s"], 1) if summary.get("wall_s") else None,
        "client_samples_per_s": round(summary["ok"] / summary["wall_s"], 1) if summary.get("wall_s") else None,
        "pipeline_wall_s": round(wall, 2), "client_process_wall_s": round(client_wall, 2),
        "pipeline_tokens_per_s": round(tokens / wall, 1) if wall else None,
        "client_startup_s": first_request, "drain_gb_per_s": round(nbytes / 1e9 / wall, 3) if wall else None,
        "logs_tail": None if ok else {p.name: tail(p) for p in sorted(logs.glob("*.log"))},
    }


def combine_summaries(summaries: list[dict]) -> dict:
    """The clients' summaries as one: counts and tokens summed, the longest wall time (the processes
    run side by side), ``ok`` the answered samples."""
    if len(summaries) <= 1:
        return summaries[0] if summaries else {}
    out = {k: sum(s.get(k) or 0 for s in summaries) for k in ("ok", "tokens", "truncated")}
    for k in ("failed", "retried"):
        merged: dict = {}
        for s in summaries:
            for reason, n in (s.get(k) or {}).items():
                merged[reason] = merged.get(reason, 0) + n
        out[k] = merged
    out["wall_s"] = max(s.get("wall_s") or 0 for s in summaries)
    out["processes"] = len(summaries)
    return out


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def run_plain_loop(url: str, prompts: list[list[int]], in_flight: int) -> dict:
    """The comparison: the same requests (prefill, one greedy token) from a plain asyncio loop (the
    overhead bench's, with rids outside any capture's prefix)."""
    from capture_server_gpu import _send

    return loop_rate(prompts, asyncio.run(_send(url, secrets.token_hex(4), prompts, in_flight, rid_prefix="plain")))


def loop_rate(prompts: list[list[int]], wall: float) -> dict:
    """What one round of a plain loop sent, and at what rate."""
    tokens = sum(map(len, prompts))
    return {"samples": len(prompts), "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1)}


_TOKENIZER_PHASES = """
import json, sys, time
t0 = time.monotonic()
from hsextract.client.chat_template import load_tokenizer
tok = load_tokenizer(sys.argv[1])
t1 = time.monotonic()
import torch
t2 = time.monotonic()
from transformers import AutoTokenizer
t3 = time.monotonic()
auto = AutoTokenizer.from_pretrained(sys.argv[1])
t4 = time.monotonic()
print(json.dumps({"client_load_tokenizer_s": round(t1 - t0, 2), "client_tokenizer_class": type(tok).__name__,
                  "import_torch_s": round(t2 - t1, 2), "import_transformers_s": round(t3 - t2, 2),
                  "auto_from_pretrained_s": round(t4 - t3, 2), "same_len": len(tok) == len(auto)}))
"""


def tokenizer_load(env: gpu_env.GpuEnv, model: Path) -> dict:
    """The client's tokenizer phase in the product's environment beside the running servers (its
    own path, in a fresh process first), then transformers' path taken apart: torch's import
    (transformers imports it), transformers' own, and ``AutoTokenizer``'s load."""
    done = subprocess.run([sys.executable, "-c", _TOKENIZER_PHASES, str(model)], env=product_env(env),
                          capture_output=True, text=True, timeout=300)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": done.stderr[-1000:]}


# ---- row comparisons -------------------------------------------------------------------------------
def load_rows(out: Path) -> dict[int, Path]:
    from hsextract.formats.manifest import iter_entries

    return {e.dataset_index: out / e.file for e in iter_entries(out)}


def load_sample(path: Path, device: str = "cpu"):
    """(ids, rows [T, K + 1, H]) of one SpecForge sample file."""
    import torch

    t = torch.load(path, map_location=device, weights_only=True)
    aux, final = t["aux_hidden_state"][0], t["hidden_state"][0]
    k = aux.shape[1] // final.shape[1]
    rows = torch.cat([aux.view(aux.shape[0], k, -1), final.view(final.shape[0], 1, -1)], dim=1)
    return t["input_ids"], rows


def compare_runs(a: Path, b: Path) -> dict:
    """Sample by sample, the rows of run ``a`` against run ``b`` (relative L2 per sample, over all slots)."""
    import torch

    rows_a, rows_b = load_rows(a), load_rows(b)
    common = sorted(set(rows_a) & set(rows_b))
    errs, equal, ids_differ = [], 0, []
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for i in common:
        (ids_a, ha), (ids_b, hb) = load_sample(rows_a[i], device), load_sample(rows_b[i], device)
        if not torch.equal(ids_a, ids_b):
            ids_differ.append(i)
            continue
        ha, hb = ha.float(), hb.float()
        if torch.equal(ha, hb):
            equal += 1
        errs.append(float((ha - hb).norm() / hb.norm().clamp_min(1e-12)))
    errs.sort()
    return {"samples": len(common), "only_in_one": len(set(rows_a) ^ set(rows_b)), "ids_differ": ids_differ,
            "bit_equal": equal, "rel_err_median": errs[len(errs) // 2] if errs else None,
            "rel_err_max": errs[-1] if errs else None,
            "ok": bool(common) and not ids_differ and len(set(rows_a) ^ set(rows_b)) == 0
            and (errs[-1] if errs else 1.0) < 0.05}


def compare_with_transformers(out: Path, model: Path, samples: int, max_tokens: int, device: str) -> dict:
    """A few short samples of a run against transformers (float32), with the CPU tests' bounds, except
    the GPU tier's median-token bound where SGLang's own GPU numerics exceed the CPU's 1 % (the tiny
    DeepSeek-V3: 2 %, `capture_checks.GPU_MEDIAN_TOKEN_BOUND`, whose comment says why)."""
    import torch
    from capture_checks import GPU_MEDIAN_TOKEN_BOUND
    from hsextract.formats.manifest import iter_entries, read_header
    from support import hf_reference
    from transformers import AutoModelForCausalLM

    header = read_header(out)
    rows = load_rows(out)
    short = {e.dataset_index for e in iter_entries(out) if e.tokens <= max_tokens}
    picked = [i for i in sorted(rows) if i in short][:samples]
    median_bound = (GPU_MEDIAN_TOKEN_BOUND.get(header.architecture, hf_reference.MEDIAN_TOKEN_BOUND)
                    if device == "cuda" else hf_reference.MEDIAN_TOKEN_BOUND)
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).to(device).eval()
    problems = {}
    for i in picked:
        ids, hidden = load_sample(rows[i])
        ref = hf_reference.reference(model, ids.tolist(), model=hf)
        found = hf_reference.row_problems(hidden, header.sglang_layers_to_capture, header.architecture,
                                          ref, header.final_hidden, median_bound=median_bound)
        if found:
            problems[i] = found
    del hf
    return {"samples": picked, "median_token_bound": median_bound, "problems": problems,
            "ok": bool(picked) and not problems}


def ceiling_sizes(prompts: list[list[int]], bytes_per_token: int) -> list[int]:
    """File sizes for the disk's ceiling: the run's samples at their length quantiles (10 to 90 %)."""
    lengths = sorted(len(p) for p in prompts) or [1]
    picks = {lengths[min(len(lengths) - 1, k * len(lengths) // 10)] for k in range(1, 10)}
    return sorted(max(64 << 10, t * bytes_per_token) for t in picks)


def disk_ceiling(directory: Path, sizes: list[int], seconds: float = 4.0) -> dict:
    """The output disk's ceiling for the drain's write pattern (hsextract.ops.disk_ceiling)."""
    from hsextract.ops.disk_ceiling import measure

    return measure(directory, sizes, seconds_per_point=seconds).as_dict()


def sample_bytes_per_token(model: Path, num_aux: int = 3) -> int:
    """A training sample's bytes per token: K + 1 bf16 rows of the model's width, its id and mask."""
    from hsextract.model_info import read_model_info

    return (num_aux + 1) * read_model_info(model).hidden_size * 2 + 16


def disk_speed(directory: Path, gb: float = 2.0) -> dict:
    """The output disk's own sequential write speed (dd, fsync at the end)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "dd.bin"
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={int(gb * 1e9 / (16 << 20))}",
                    "conv=fsync"], check=True, capture_output=True)
    wall = time.monotonic() - t0
    nbytes = target.stat().st_size
    target.unlink()
    return {"gb": round(nbytes / 1e9, 2), "gb_per_s": round(nbytes / 1e9 / wall, 3)}


# ---- servers ---------------------------------------------------------------------------------------
def parallel_args(tp: int, dp_attention: int) -> tuple[str, ...]:
    args: list[str] = []
    if tp > 1:
        args += ["--tp", str(tp), "--disable-custom-all-reduce"]
    if dp_attention > 1:
        args += ["--enable-dp-attention", "--dp", str(dp_attention)]
    return tuple(args)


def plan_models(kinds: list[str], env: gpu_env.GpuEnv, work: Path, gpu: int, say) -> list[ModelPlan]:
    """Each model's directory (generated here) and the server flags it runs with."""
    from hsextract.tiny_model import ensure_tiny_model

    plans = []
    tiny_llama = ensure_tiny_model("llama", work / "models" / "llama")
    for kind in kinds:
        if kind == "llama8b" and env.cuda:
            import capture_server_gpu

            t0 = time.monotonic()
            path = capture_server_gpu.prepare_model(env, work, gpu)
            say(f"8B-shaped model ready in {time.monotonic() - t0:.0f} s")
            plans.append(ModelPlan(kind, path, 32768, "w", 8192, (
                "--chunked-prefill-size", "8192", "--max-total-tokens", "131072", "--max-running-requests", "256",
                "--mem-fraction-static", "0.9", "--cuda-graph-max-bs-decode", "8")))
        elif kind == "llama8b":  # the dry run: the tiny Llama in its place
            plans.append(ModelPlan(kind, tiny_llama, 2048, "en", 64, (
                "--chunked-prefill-size", "64", "--max-total-tokens", "8192", "--max-running-requests", "32")))
        elif kind == "tiny":  # the client's ceiling: short prompts, a server that answers at once
            plans.append(ModelPlan(kind, tiny_llama, 2048, "en", 2048, (
                "--max-total-tokens", "262144", "--max-running-requests", "512", "--mem-fraction-static", "0.1")
                if env.cuda else ("--max-total-tokens", "8192", "--max-running-requests", "64"),
                sides=("plain_loop", "loop_on_capture", "pipeline", "pipeline_2_processes", "client_alone",
                       "pipeline_drain_first"),
                samples=6000 if env.cuda else 300, mean_words=12, long_prompts=False))
        else:
            path = ensure_tiny_model("dsv3-gpu" if env.cuda else "dsv3", work / "models" / "dsv3")
            gpu_args = ("--disable-cuda-graph",) if env.cuda else ()
            plans.append(ModelPlan(kind, path, 2048, "en", 128, (
                "--chunked-prefill-size", "128", "--max-total-tokens", "16384", "--max-running-requests", "64",
                "--mem-fraction-static", "0.1", *gpu_args) if env.cuda else (
                "--chunked-prefill-size", "64", "--max-total-tokens", "8192", "--max-running-requests", "32")))
    return plans


def start_servers(plan: ModelPlan, env: gpu_env.GpuEnv, work: Path, gpus: tuple[int, ...], port: int,
                  extra: tuple[str, ...], plain: bool) -> None:
    """Overlap capture, no-overlap capture and (for the throughput rounds) plain servers of ``plan``."""
    if not env.cuda:  # the CPU engine has no overlap scheduler to switch off: two capture servers alike
        extra = ()
    specs = {"capture": ServerSpec(f"{plan.kind}-capture", plan.path, port, gpus, True, (*plan.server_args, *extra)),
             "no_overlap": ServerSpec(f"{plan.kind}-capture-no-overlap", plan.path, port + 1, gpus, True,
                                      (*plan.server_args, *extra, "--disable-overlap-schedule"))}
    if plain:
        specs["plain"] = ServerSpec(f"{plan.kind}-plain", plan.path, port + 2, gpus, False, (*plan.server_args, *extra))
    plan.servers = {name: start(spec, env, work) for name, spec in specs.items()}


def wait_servers(plan: ModelPlan, deadline: float) -> None:
    for handle in plan.servers.values():
        wait_healthy(handle, max(60.0, deadline - time.monotonic()))


def stop_servers(plan: ModelPlan) -> None:
    with ThreadPoolExecutor() as pool:
        list(pool.map(lambda h: h.stop(), plan.servers.values()))
    plan.servers = {}


# ---- the runs --------------------------------------------------------------------------------------
def correctness(plan: ModelPlan, env: gpu_env.GpuEnv, work: Path, args: argparse.Namespace, say, save,
                deadline: float) -> dict:
    dataset = work / f"{plan.kind}-data.jsonl"
    samples = args.dsv3_samples if plan.kind == "dsv3" and args.dsv3_samples else args.samples
    made = write_dataset(dataset, samples, plan.context, plan.words, seed=args.seed)
    say(f"{plan.kind}: dataset {made}")
    max_tokens = plan.context - 16
    res: dict = {"dataset": made, "runs": {}}
    save(plan.kind, res)
    outs = {}
    bounds = args.dsv3_in_flight if plan.kind == "dsv3" and args.dsv3_in_flight else args.in_flight
    for n in bounds:
        if time.monotonic() > deadline:
            res["runs"][f"overlap-{n}"] = {"ok": False, "skipped": "out of time"}
            continue
        out = work / f"{plan.kind}-overlap-{n}"
        r = run_pipeline(env, plan.servers["capture"], plan.path, dataset, out, n, max_tokens)
        res["runs"][f"overlap-{n}"] = r
        save(plan.kind, res)
        say(f"{plan.kind} overlap, {n} in flight: {brief(r)}")
        if n == bounds[0]:
            outs[n] = out
        else:  # checked by the drain; the disk keeps only the default's set, for the row comparisons
            shutil.rmtree(out, ignore_errors=True)
    default = bounds[0]
    compare = plan.kind in args.compare_no_overlap.split(",")
    if compare:
        out_b = work / f"{plan.kind}-no-overlap-{default}"
        r = run_pipeline(env, plan.servers["no_overlap"], plan.path, dataset, out_b, default, max_tokens)
        res["runs"][f"no-overlap-{default}"] = r
        say(f"{plan.kind} no overlap, {default} in flight: {brief(r)}")
        if default in outs and r["samples"]:
            res["overlap_vs_no_overlap"] = compare_runs(outs[default], out_b)
            say(f"{plan.kind} rows, overlap vs no overlap: {res['overlap_vs_no_overlap']}")
        shutil.rmtree(out_b, ignore_errors=True)
    res["ok"] = all(r.get("ok") for r in res["runs"].values()) and (
        not compare or res.get("overlap_vs_no_overlap", {}).get("ok", False))
    res["_default_output"] = str(outs.get(default, ""))
    return res


def run_loop_on_capture(server: ServerHandle, prompts: list[list[int]], in_flight: int) -> dict:
    """The plain loop against a capture server, its requests captured: the server's own pace with the
    capture (no client bookkeeping, no drain). A stand-in drain in a process of its own checks each
    dump's ids and fingerprint and removes it."""
    from capture_server_gpu import StagingCounter, _send

    run_id = secrets.token_hex(4)
    counter = StagingCounter(server.dump_dir, run_id, prompts, remove=True)
    counter.start()
    wall = asyncio.run(_send(server.url, run_id, prompts, in_flight, rid_prefix="hsx"))
    counter.wait_for(len(prompts))
    return {**loop_rate(prompts, wall), "complete_dumps": counter.complete, "wrong_dumps": counter.wrong,
            "failure_markers": counter.failed,
            "ok": counter.complete == len(prompts) and not counter.wrong and not counter.failed}


def throughput(plan: ModelPlan, env: gpu_env.GpuEnv, work: Path, args: argparse.Namespace, say, save,
               deadline: float) -> dict:
    """Alternating rounds, in a rotating order, of: the plain loop on the plain server; the plain loop
    on the overlap and on the no-overlap capture server (what the capture and the overlap scheduler
    cost at the server); the whole product on the overlap capture server."""
    dataset = work / f"{plan.kind}-data.jsonl"
    res: dict = {"cases": []}
    if plan.samples or not dataset.exists():
        dataset = work / f"{plan.kind}-throughput-data.jsonl"
        res["dataset"] = write_dataset(dataset, plan.samples or args.samples, plan.context, plan.words,
                                       seed=args.seed, mean_words=plan.mean_words, long_prompts=plan.long_prompts)
    max_tokens = plan.context - 16
    prompts = encode(dataset, plan.path, max_tokens)
    res["output_root"] = str(args.output_root)
    res["disk"] = disk_speed(args.output_root / "dd")
    per_token = sample_bytes_per_token(plan.path)
    sizes = ceiling_sizes(prompts, per_token)
    # The disk's ceiling in the same call, before the rounds and after them (the better is the ceiling).
    res["disk_ceiling"] = [disk_ceiling(args.output_root / "ceiling", sizes)]
    say(f"{plan.kind}: disk ceiling {res['disk_ceiling'][0]['disk_ceiling_gb_per_s']} GB/s")
    on_disk = {"output_root": str(args.output_root), "reaped": bool(args.reap_output), "bytes_per_token": per_token}
    res["tokenizer_load"] = tokenizer_load(env, plan.path)
    say(f"{plan.kind}: the client's tokenizer phase, apart: {res['tokenizer_load']}")
    say(f"{plan.kind}: disk {res['disk']}")
    sides = tuple(x for x in plan.sides if x in args.sides.split(",")) if args.sides else plan.sides
    done: list[tuple[int, dict[str, list[dict]]]] = []
    for n in args.throughput_in_flight:
        rows: dict[str, list[dict]] = {side: [] for side in sides}
        for r in range(args.rounds):
            if time.monotonic() > deadline:
                break
            k = r % len(sides)
            for side in sides[k:] + sides[:k]:
                if side == "plain_loop":
                    rows[side].append(run_plain_loop(plan.servers["plain"].url, prompts, n))
                elif side == "loop_on_capture":
                    rows[side].append(run_loop_on_capture(plan.servers["capture"], prompts, n))
                elif side == "loop_on_capture_no_overlap":
                    rows[side].append(run_loop_on_capture(plan.servers["no_overlap"], prompts, n))
                else:
                    procs = 2 if side == "pipeline_2_processes" else 1
                    out = args.output_root / f"{plan.kind}-bench-{n}-{r}-{side}"
                    profile = (args.profile_client / f"pyspy-{plan.kind}-{side}-{n}-{r}.txt"
                               if args.profile_client else None)
                    drain_profile = (args.profile_drain / f"pyspy-drain-{plan.kind}-{side}-{n}-{r}.txt"
                                     if args.profile_drain and r == 0 else None)
                    rows[side].append(run_pipeline(env, plan.servers["capture"], plan.path, dataset, out, n,
                                                   max_tokens, selfcheck_share=0.01, processes=procs,
                                                   drain_after=side == "client_alone",
                                                   drain_first=side == "pipeline_drain_first", profile=profile,
                                                   profile_drain=drain_profile, reap=args.reap_output))
                    shutil.rmtree(out, ignore_errors=True)
                say(f"{plan.kind} round {r} {side} {n} in flight: {brief(rows[side][-1])}")
            save({**res, "cases": [case_result(m, x, _ceiling(res), **on_disk) for m, x in [*done, (n, rows)]]})
        done.append((n, rows))
    res["disk_ceiling"].append(disk_ceiling(args.output_root / "ceiling", sizes))
    res["cases"] = [case_result(n, rows, _ceiling(res), **on_disk) for n, rows in done]
    return res


def _ceiling(res: dict) -> float:
    return max(c["disk_ceiling_gb_per_s"] for c in res["disk_ceiling"])


def case_result(in_flight: int, rows: dict[str, list[dict]], ceiling_gb_per_s: float | None = None, *,
                output_root: str = "", reaped: bool = False, bytes_per_token: float = 0) -> dict:
    """One in-flight bound's rounds, summed up; with the disk's ceiling, the keys every pipeline figure
    carries (bench/common.on_disk_keys): the whole pipeline (the drain up first where it ran, as the
    units run it) over min(the plain loop, the ceiling's tokens/s)."""
    from common import on_disk_keys, pipeline_over_ceiling

    out = _case_figures(in_flight, rows)
    whole = out["drain_first_whole_tokens_per_s"] or out["whole_pipeline_tokens_per_s"]
    plain = out["plain_loop_tokens_per_s"]
    drains = [x["drain_gb_per_s"] for side in ("pipeline", "pipeline_drain_first") for x in rows.get(side, [])
              if x.get("drain_gb_per_s")]
    over = (pipeline_over_ceiling(whole["median"], plain["median"], ceiling_gb_per_s, bytes_per_token)
            if whole and plain and ceiling_gb_per_s and bytes_per_token else None)
    return {**out, **on_disk_keys(output_root, ceiling_gb_per_s, statistics.median(drains) if drains else None,
                                  reaped=reaped, whole_over_ceiling=over)}


def _case_figures(in_flight: int, rows: dict[str, list[dict]]) -> dict:
    pipeline = rows.get("pipeline", [])
    plain = [x["tokens_per_s"] for x in rows.get("plain_loop", [])]
    on_capture = [x["tokens_per_s"] for x in rows.get("loop_on_capture", [])]
    no_overlap = [x["tokens_per_s"] for x in rows.get("loop_on_capture_no_overlap", [])]
    client = [x["client_tokens_per_s"] for x in rows.get("pipeline", []) if x.get("client_tokens_per_s")]
    whole = [x["pipeline_tokens_per_s"] for x in rows.get("pipeline", []) if x.get("pipeline_tokens_per_s")]
    plain_sps = [x["samples"] / x["wall_s"] for x in rows.get("plain_loop", [])]
    client_sps = [x["client_samples_per_s"] for x in rows.get("pipeline", []) if x.get("client_samples_per_s")]
    first = rows.get("pipeline_drain_first", [])
    first_whole = [x["pipeline_tokens_per_s"] for x in first if x.get("pipeline_tokens_per_s")]
    first_sps = [x["samples"] / x["pipeline_wall_s"] for x in first if x.get("pipeline_wall_s")]
    two_sps = [x["client_samples_per_s"] for x in rows.get("pipeline_2_processes", []) if x.get("client_samples_per_s")]
    alone_sps = [x["client_samples_per_s"] for x in rows.get("client_alone", []) if x.get("client_samples_per_s")]
    drain_sps = [x["drain_alone_samples_per_s"] for x in rows.get("client_alone", [])
                 if x.get("drain_alone_samples_per_s")]
    after_startup = [x["tokens"] / (x["pipeline_wall_s"] - x["client_startup_s"]) for x in rows.get("pipeline", [])
                     if x.get("client_startup_s") and x.get("tokens")]
    med = statistics.median

    def spread(v: list[float]) -> dict:
        return {"median": med(v), "min": min(v), "max": max(v)} if v else {}

    return {"in_flight": in_flight, "rounds": len(plain), "plain_loop_tokens_per_s": spread(plain),
            "client_phase_tokens_per_s": spread(client), "whole_pipeline_tokens_per_s": spread(whole),
            "loop_on_capture_tokens_per_s": spread(on_capture),
            "loop_on_capture_no_overlap_tokens_per_s": spread(no_overlap),
            "capture_server_over_plain": round(med(on_capture) / med(plain), 4) if on_capture and plain else None,
            "no_overlap_over_overlap": round(med(no_overlap) / med(on_capture), 4) if no_overlap and on_capture
            else None,
            "client_phase_over_plain": round(med(client) / med(plain), 4) if client and plain else None,
            "whole_pipeline_over_plain": round(med(whole) / med(plain), 4) if whole and plain else None,
            "plain_loop_samples_per_s": spread([round(v, 1) for v in plain_sps]),
            "client_phase_samples_per_s": spread(client_sps),
            "client_samples_over_plain": round(med(client_sps) / med(plain_sps), 4) if client_sps and plain_sps
            else None,
            "two_processes_samples_per_s": spread(two_sps),
            "two_processes_over_plain": round(med(two_sps) / med(plain_sps), 4) if two_sps and plain_sps else None,
            "client_alone_samples_per_s": spread(alone_sps),
            "client_alone_over_plain": round(med(alone_sps) / med(plain_sps), 4) if alone_sps and plain_sps else None,
            "drain_alone_samples_per_s": spread(drain_sps),
            # the drain up before the client, as the units run them: from the client's start to the drain's exit
            "drain_first_whole_tokens_per_s": spread(first_whole),
            "drain_first_whole_over_plain": round(med(first_whole) / med(plain), 4) if first_whole and plain else None,
            "drain_first_whole_samples_per_s": spread([round(v, 1) for v in first_sps]),
            "drain_first_tail_s": spread([x["tail_s"] for x in first if "tail_s" in x]),
            "drain_up_before_client_s": spread([x["drain_up_before_client_s"] for x in first
                                                if x.get("drain_up_before_client_s")]),
            # from the first request to the drain's exit: the pipeline's pace once started (these runs are
            # short, so the start-up is a large share of their wall time)
            "whole_after_startup_tokens_per_s": spread([round(v, 1) for v in after_startup]),
            "whole_after_startup_over_plain": round(med(after_startup) / med(plain), 4) if after_startup and plain
            else None,
            "client_startup_s": spread([x["client_startup_s"] for x in pipeline if x.get("client_startup_s")]),
            "drain_gb_per_s_spread": spread([x["drain_gb_per_s"] for x in pipeline if x.get("drain_gb_per_s")]),
            "all_validated": all(x["ok"] for side in ALL_SIDES[1:] for x in rows.get(side, [])),
            "per_round": rows}


def brief(r: dict) -> str:
    keys = ("ok", "samples", "tokens", "client_tokens_per_s", "pipeline_tokens_per_s", "tokens_per_s",
            "client_startup_s", "quarantined_by_reason", "selfchecked", "selfcheck", "accounts")
    return json.dumps({k: r[k] for k in keys if k in r})


def gpu_tests(env: gpu_env.GpuEnv, work: Path) -> dict:
    """The CUDA-only unit tests of the capture (the overwrite race, the shared buffers) on this GPU."""
    tests = ["tests/capture/test_owned_batch.py", "tests/capture/test_writer_process.py::"
             "test_on_cuda_the_shared_buffers_are_registered_and_the_rows_land_exactly"]
    run_env = env.server_env((0,))
    run_env["PYTHONPATH"] += os.pathsep + str(REPO / "tests")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *tests],
                          cwd=REPO, env=run_env, capture_output=True, text=True, timeout=600)
    res: dict = {"ok": done.returncode == 0, "tail": "\n".join((done.stdout + done.stderr).splitlines()[-15:])}
    cost = subprocess.run([sys.executable, str(HERE / "fingerprint_cost.py")], cwd=REPO, env=run_env,
                          capture_output=True, text=True, timeout=300)
    try:
        res["fingerprint_cost"] = json.loads(cost.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        res["fingerprint_cost"] = {"error": cost.stderr[-2000:]}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--bundle", type=Path, default=REPO / ".gpu")
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {MODEL_KINDS}")
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--dsv3-samples", type=int, default=0, help="the tiny DeepSeek's dataset size (0: --samples)")
    ap.add_argument("--dsv3-in-flight", default="", help="the tiny DeepSeek's bounds (default: --in-flight)")
    ap.add_argument("--compare-no-overlap", default=DEFAULT_MODELS,
                    help="the models whose rows are compared with a no-overlap server's")
    ap.add_argument("--in-flight", default="32,128,256", help="in-flight bounds; the first is the default's")
    ap.add_argument("--rounds", type=int, default=0, help="alternating throughput rounds per side (0: none)")
    ap.add_argument("--throughput-models", default="llama8b,tiny",
                    help="the models that run the throughput rounds (with --rounds > 0)")
    ap.add_argument("--throughput-in-flight", default="",
                    help="the throughput rounds' in-flight bounds (default: the first two of --in-flight)")
    ap.add_argument("--correctness-models", default=None,
                    help="the models whose correctness runs are made (default: every model of --models; the "
                         "throughput rounds' pipelines are validated all the same)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--dp-attention", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-gpu-tests", action="store_true")
    ap.add_argument("--transformers-samples", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=560)
    ap.add_argument("--work", type=Path, default=Path("/tmp/hsx-pipeline"))
    ap.add_argument("--sides", default="", help=f"only these of the throughput rounds' sides, of {ALL_SIDES} (default: "
                    "each model's own)")
    ap.add_argument("--output-root", type=Path, default=None,
                    help="where the throughput rounds' training sets go (default: --work); e.g. /dev/shm/hsx-out for "
                         "a disk that keeps up with the server")
    ap.add_argument("--profile-client", type=Path, default=None,
                    help="py-spy the (first) client of every product round into this directory")
    ap.add_argument("--reap-output", action="store_true",
                    help="delete each sample's file once the drain has recorded it: runs longer than memory holds")
    ap.add_argument("--profile-drain", type=Path, default=None,
                    help="py-spy the drain and its worker processes of each product side's first round into this "
                         "directory")
    ap.add_argument("--results", type=Path)
    args = ap.parse_args()
    args.in_flight = [int(x) for x in args.in_flight.split(",")]
    args.dsv3_in_flight = [int(x) for x in args.dsv3_in_flight.split(",") if x]
    args.throughput_in_flight = [int(x) for x in args.throughput_in_flight.split(",") if x] or args.in_flight[:2]
    args.throughput_models = args.throughput_models.split(",")
    args.correctness_models = (args.models if args.correctness_models is None else args.correctness_models).split(",")
    deadline = time.monotonic() + args.budget_s
    args.work.mkdir(parents=True, exist_ok=True)
    args.output_root = args.output_root or args.work
    args.output_root.mkdir(parents=True, exist_ok=True)
    for d in (args.profile_client, args.profile_drain):
        if d:
            d.mkdir(parents=True, exist_ok=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results_dir = args.results or (REPO / "bench" / "results" if args.device == "cuda" else args.work / "results")
    results_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()

    def say(msg: str) -> None:
        line = f"[{time.monotonic() - t0:6.1f}s] {msg}"
        print(line, flush=True)
        if out_dir:
            with open(out_dir / "pipeline_gpu.log", "a") as f:
                f.write(line + "\n")

    result: dict = {"benchmark": "pipeline_gpu", "device": args.device, "tp": args.tp,
                    "dp_attention": args.dp_attention, "in_flight": args.in_flight, "samples": args.samples,
                    "format": FORMAT, "models": {}, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save() -> None:
        for d in (results_dir, out_dir):
            if d:
                (d / "pipeline_gpu.json").write_text(json.dumps(result, indent=2) + "\n")

    try:
        run(args, result, say, save, deadline)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-4000:]
        say(f"FAILED: {result['error']}")
    finally:
        save()
        if out_dir:  # the logs alone (a kept training set is gigabytes)
            # the servers' logs under --work, the clients' and drains' beside their outputs under --output-root
            members = []
            for root in dict.fromkeys((args.work, args.output_root)):
                members += ["-C", str(root), *sorted(str(p.relative_to(root)) for p in root.rglob("*.log")
                                                     if p.stat().st_size < 50e6)]
            subprocess.run(["tar", "czf", str(out_dir / "pipeline-logs.tar.gz"), *members],
                           check=False, capture_output=True)
    ok = result.get("ok", False)
    say("ALL PASSED" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def run(args: argparse.Namespace, result: dict, say, save, deadline: float) -> None:
    env = gpu_env.install(args.bundle, SITE, args.work / "install.log") if args.device == "cuda" else gpu_env.cpu_env()
    gpus = tuple(range(max(args.tp, args.dp_attention)))
    extra = parallel_args(args.tp, args.dp_attention)
    plans = plan_models(args.models.split(","), env, args.work, gpus[0], say)
    def start_model(k: int) -> None:
        # The throughput rounds run on the 8B-shaped model and, for the client's ceiling, the tiny one.
        plain = args.rounds > 0 and plans[k].kind in args.throughput_models
        start_servers(plans[k], env, args.work, gpus, PORT + 10 * k, extra, plain=plain)

    # One model's servers start together; the next model's once these are up, while these run: SGLang
    # sizes its KV cache from the memory that loading its weights took, which another model loading at
    # the same moment distorts (a tiny DeepSeek beside three 8B servers refused to start).
    start_model(0)
    checks = ThreadPoolExecutor(max_workers=1).submit(gpu_tests, env, args.work) if args.device == "cuda" \
        and not args.skip_gpu_tests else None
    oks = []
    try:
        for k, plan in enumerate(plans):
            model_res = result["models"].setdefault(plan.kind, {"model": plan.path.name})
            try:
                wait_servers(plan, deadline)
            except Exception as exc:  # one model's server that cannot start does not take the other's run
                model_res["error"] = f"{type(exc).__name__}: {str(exc)[-3000:]}"
                say(f"{plan.kind}: a server did not start: {model_res['error'][-1500:]}")
                oks.append(False)
                stop_servers(plan)
                continue
            finally:
                if k + 1 < len(plans):
                    start_model(k + 1)
            say(f"{plan.kind}: servers healthy")
            if plan.kind in args.correctness_models:
                model_res["correctness"] = correctness(
                    plan, env, args.work, args, say,
                    lambda kind, res: (result["models"][kind].update(correctness=res), save()), deadline - 60)
                oks.append(model_res["correctness"]["ok"])
                save()
            if args.rounds > 0 and "plain" in plan.servers:
                model_res["throughput"] = throughput(
                    plan, env, args.work, args, say,
                    lambda partial, m=model_res: (m.update(throughput=partial), save()), deadline - 90)
                ran = [case for case in model_res["throughput"]["cases"] if case["rounds"] > 0]
                # a bound the time left no round for is said (rounds 0), not counted as a failure
                oks += [bool(ran)] + [case["all_validated"] for case in ran]
                save()
    finally:
        for plan in plans:
            stop_servers(plan)
    if checks is not None:
        result["gpu_unit_tests"] = checks.result()
        oks.append(result["gpu_unit_tests"]["ok"])
        say(f"GPU unit tests: {result['gpu_unit_tests']}")
    for plan in plans:
        corr = result["models"][plan.kind].get("correctness")
        if corr is None:
            continue
        out = Path(corr.pop("_default_output", "") or "/nonexistent")
        # The 8B model in float32 takes a minute to load: only with the time for it.
        needed = 150 if plan.kind == "llama8b" and args.device == "cuda" else 30
        if args.transformers_samples and out.is_dir() and time.monotonic() < deadline - needed:
            corr["transformers"] = compare_with_transformers(out, plan.path, args.transformers_samples, 2048,
                                                             args.device)
            say(f"{plan.kind} vs transformers: {corr['transformers']}")
            oks.append(corr["transformers"]["ok"])
        shutil.rmtree(out, ignore_errors=True)
        save()
    result["ok"] = bool(oks) and all(oks)


if __name__ == "__main__":
    sys.exit(main())
