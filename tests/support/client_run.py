"""Helpers for the client's end-to-end tests: a mixed dataset whose truth is known line by line,
the real ``hsextract extract`` and ``hsextract drain`` commands as subprocesses, and checks of the
training set against that truth.

The expected token ids and loss masks are derived here independently of the client: from the
tiny model's template written out by hand as (text, is_reply) segments, each tokenized alone
(see tests/dataset/test_chat_template.py), and cross-checked against transformers' own
``apply_chat_template(tokenize=True)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO / "files" / "python"

_TEXT = (
    "the capital city of france is paris hello world this is a tiny test model for sglang deep learning "
    "models produce hidden states at every layer we dump auxiliary during prefill to shared memory quick "
    "brown fox jumps over lazy dog user asks question and assistant answers it politely speculative "
    "decoding drafts tokens that target verifies"
)
WORDS = _TEXT.split()


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR), e.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    e.setdefault("OMP_NUM_THREADS", "1")
    return e


@dataclass
class Expected:
    """The truth about a dataset: which lines must reach the training set, with which tokens."""

    samples: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # index -> (ids, mask)
    rejects: dict[int, str] = field(default_factory=dict)  # index -> reason
    total_lines: int = 0


def _sentence(rng, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def expected_tokens(tok, messages: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids and mask of a conversation under the tiny model's template, by hand-cut segments."""
    segments = [("<s>", 0)]
    for role, content in messages:
        if role == "assistant":
            segments += [("<|assistant|>", 0), (f"{content}</s>", 1)]
        else:
            segments.append((f"<|{role}|>{content}</s>", 0))
    ids, mask = [], []
    for text, flag in segments:
        seg = tok(text, add_special_tokens=False)["input_ids"]
        ids += seg
        mask += [flag] * len(seg)
    hf = tok.apply_chat_template([{"role": r, "content": c} for r, c in messages], tokenize=True)
    hf_ids = list(hf["input_ids"] if hasattr(hf, "keys") else hf)
    assert ids == hf_ids, "hand-cut segments disagree with the chat template's own tokenization"
    return ids, mask


def write_mixed_dataset(
    path: Path, tok, n_lines: int = 100, seed: int = 0, max_words: int = 9, bad: bool = True
) -> Expected:
    """ShareGPT, OpenAI and pre-tokenized lines, plus (if `bad`) one line of each kind of bad input."""
    import random

    rng = random.Random(seed)
    exp = Expected(total_lines=n_lines)
    lines: list[bytes] = []
    bad_lines = (
        {
            5: (b'{"messages": [{"role": "user", "content": "hi"}', "malformed_json"),
            13: (b'{"conversations": [{"from": "human", "value": "caf\xe9"}]}', "not_utf8"),
            21: (
                b'{"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]}',
                "unknown_role",
            ),
            29: (
                b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}',
                "empty_content",
            ),
            37: (b'{"prompt": "no known shape"}', "unknown_shape"),
            45: (b"", "blank_line"),
            53: (None, "duplicate"),  # a copy of line 1 (index 0)
            61: (b'{"input_ids": [1, 2, 3], "loss_mask": [1, 0]}', "bad_loss_mask"),
            69: (b'{"messages": [{"role": "user", "content": "only a question"}]}', "no_assistant_turn"),
            77: (None, "too_long"),  # a conversation longer than the client's --max-tokens 300 (overlong=skip)
        }
        if bad
        else {}
    )
    for index in range(n_lines):
        if index in bad_lines:
            raw, reason = bad_lines[index]
            if reason == "duplicate":
                raw = lines[0]
            elif reason == "too_long":
                msgs = [("user", _sentence(rng, 5)), ("assistant", " ".join(["the lazy dog"] * 120))]
                raw = json.dumps({"messages": [{"role": r, "content": c} for r, c in msgs]}).encode()
            lines.append(raw)
            exp.rejects[index] = reason
            continue
        turns = 1 + index % 3
        msgs: list[tuple[str, str]] = []
        if index % 7 == 0:
            msgs.append(("system", _sentence(rng, 3)))
        for _ in range(turns):
            msgs += [
                ("user", _sentence(rng, rng.randint(2, max_words))),
                ("assistant", _sentence(rng, rng.randint(2, max_words))),
            ]
        ids, mask = expected_tokens(tok, msgs)
        shape = index % 3
        if shape == 0:
            role_name = {"user": "human", "assistant": "gpt", "system": "system"}
            obj = {"conversations": [{"from": role_name[r], "value": c} for r, c in msgs]}
        elif shape == 1:
            obj = {"messages": [{"role": r, "content": c} for r, c in msgs], "id": f"s{index}"}
        else:
            mask = [int(i % 2 == 0 or m) for i, m in enumerate(mask)]  # any mask the dataset author chose
            obj = {"input_ids": ids, "loss_mask": mask}
        lines.append(json.dumps(obj).encode())
        exp.samples[index] = (ids, mask)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return exp


# -- the real commands -------------------------------------------------------------------------------


def extract_args(
    server_url: str, dataset: Path, model: Path, dump: Path, output: Path, *extra: str, fmt: str = "specforge"
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hsextract",
        "extract",
        "--server",
        server_url,
        "--dataset",
        str(dataset),
        "--model",
        str(model),
        "--dump-dir",
        str(dump),
        "--output",
        str(output),
        "--format",
        fmt,
        "--log-every",
        "2",
        *extra,
    ]


def start_client(log: Path, *args: str) -> subprocess.Popen:
    fh = log.open("ab")
    return subprocess.Popen(list(args), env=env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def start_drain(
    log: Path, dump: Path, output: Path, model: Path, fmt: str = "specforge", *extra: str
) -> subprocess.Popen:
    """``hsextract drain --exit-when-done`` as the unit runs it, with `extra` flags."""
    fh = log.open("ab")
    cmd = [
        sys.executable,
        "-m",
        "hsextract",
        "drain",
        "--dump-dir",
        str(dump),
        "--output",
        str(output),
        "--format",
        fmt,
        "--model",
        str(model),
        "--exit-when-done",
        "--poll-interval",
        "0.2",
        "--finalize-idle",
        "3600",
        *extra,
    ]
    return subprocess.Popen(cmd, env=env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen | None, sig: int = signal.SIGKILL) -> None:
    """Stop a process this test started (its own session): used in finalizers, also on failure."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def wait_exit(proc: subprocess.Popen, timeout: float, log: Path) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{proc.args[3]} still running after {timeout:.0f} s:\n{tail(log)}") from None


def tail(log: Path, n: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def client_status(output: Path) -> dict:
    try:
        return json.loads((output / ".hsextract" / "client-status.json").read_text())
    except (OSError, ValueError):
        return {}


def lines_unsent(status: dict) -> int:
    """Lines of the client's shard it has neither sent, skipped (already done) nor rejected, by its
    status `status` (what a stop must leave for it to land mid-run)."""
    return status.get("samples_total", 0) - sum(status.get(k, 0) for k in ("sent", "skipped", "rejected"))


def wait_for(predicate, timeout: float, what: str, log: Path | None = None, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}" + (f":\n{tail(log)}" if log else ""))


# -- the training set ------------------------------------------------------------------------------


def training_set(output: Path) -> dict[int, list[dict]]:
    """dataset index -> the specforge samples written for it (a list, so duplicates show)."""
    from hsextract.output.manifest import iter_entries

    found: dict[int, list[dict]] = {}
    for entry in iter_entries(output):
        data = torch.load(output / entry.file, weights_only=True)
        found.setdefault(entry.dataset_index, []).append(data)
    return found


def assert_training_set_matches(output: Path, exp: Expected) -> None:
    found = training_set(output)
    dupes = {i: len(v) for i, v in found.items() if len(v) > 1}
    assert not dupes, f"samples written more than once: {dupes}"
    assert sorted(found) == sorted(exp.samples), (
        f"missing {sorted(set(exp.samples) - set(found))}, unexpected {sorted(set(found) - set(exp.samples))}"
    )
    for index, (ids, mask) in exp.samples.items():
        data = found[index][0]
        assert data["input_ids"].tolist() == ids, f"sample {index}: token ids differ"
        assert data["loss_mask"].tolist() == mask, f"sample {index}: loss mask differs from the assistant tokens"
        assert data["hidden_state"].shape[1] == len(ids)
