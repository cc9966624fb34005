"""Load an output directory with a trainer's own reader (in a subprocess) and compare with what was captured."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from hsextract.output.manifest import iter_entries

LOADER = Path(__file__).with_name("load_with_reader.py")
READER_DIR = {
    "specforge": "specforge",
    "speculators": "speculators",
    "speculators-v1": "speculators-v1",
    "modelopt": "modelopt",
}


class _Loader:
    """A process of `load_with_reader.py --serve FORMAT` with one reader on its path, kept for this
    test process's later loads of that format (its imports cost about 10 CPU-seconds a process)."""

    def __init__(self, readers: Path, fmt: str):
        self.fmt = fmt
        fd, name = tempfile.mkstemp(prefix=f"{fmt}-reader-", suffix=".log")
        os.close(fd)
        self.log = Path(name)  # the readers' own output, shown when a load fails
        env = dict(os.environ, PYTHONPATH=str(readers / READER_DIR[fmt]), OMP_NUM_THREADS="1")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(LOADER), "--serve", fmt],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def request(self, req: dict, timeout: float = 300) -> None:
        """Send one request (load_with_reader.py's `answer` says which) and wait for its answer."""
        start = self.log.stat().st_size
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            output = self._log_since(start)
            self.close()
            raise AssertionError(
                f"{self.fmt} reader gave no answer within {timeout:.0f} s (exit status {self.proc.poll()}):\n{output}"
            )
        answer = json.loads(line)
        assert answer["ok"], f"{self.fmt} reader failed:\n{answer['error']}\n{self._log_since(start)}"

    def _log_since(self, start: int) -> str:
        with self.log.open("rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.unlink(missing_ok=True)


_loaders: dict[tuple[Path, str], _Loader] = {}


@atexit.register
def _close_loaders() -> None:
    while _loaders:
        _loaders.popitem()[1].close()


def _loader(readers: Path, fmt: str) -> _Loader:
    loader = _loaders.get((readers, fmt))
    if loader is None or loader.proc.poll() is not None:
        loader = _loaders[(readers, fmt)] = _Loader(readers, fmt)
    return loader


def load_with_reader(readers: Path, fmt: str, root: Path, num_aux: int, hidden: int, backend: str = "") -> dict:
    """What the trainer's own reader of `fmt` yields for the output `root` (see load_with_reader.py);
    `backend`: speculators' ``--hidden-states-backend`` (file, fp8), where it is not the default."""
    result = root.parent / f"{fmt}{'-' + backend if backend else ''}-reader.pt"
    request = {"root": str(root), "result": str(result), "num_aux": num_aux, "hidden": hidden}
    _loader(readers, fmt).request({**request, "backend": backend} if backend else request)
    return torch.load(result, weights_only=False)


def load_vocab_with_reader(
    readers: Path, peer: str, root: Path, sizes: list[int], vocab_size: int, suffix: str, model: Path
) -> dict:
    """The draft vocabulary mappings that `peer`'s own code builds from the output `root`'s files and
    counts (see vocab_with_reader.py), loaded in the same process as that peer's samples."""
    result = root.parent / f"{peer}-vocab.pt"
    _loader(readers, peer).request(
        {
            "kind": "vocab",
            "root": str(root),
            "result": str(result),
            "sizes": sizes,
            "vocab_size": vocab_size,
            "suffix": suffix,
            "model": str(model),
        }
    )
    return torch.load(result, weights_only=False)


def assert_reader_sees_captured(fmt: str, out: Path, loaded: dict, captured: dict) -> None:
    entries = list(iter_entries(out))
    assert sorted(e.dataset_index for e in entries) == sorted(captured)
    assert loaded["modules"] == [], "a reader pulled in sglang or vllm"
    assert loaded["error_records"] == 0
    assert sorted(loaded["samples"]) == [e.output_index for e in entries]
    for e in entries:
        got, want = loaded["samples"][e.output_index], captured[e.dataset_index]
        k = want.hidden.shape[1] - 1
        t, h = want.hidden.shape[0], want.hidden.shape[2]
        aux = want.hidden[:, :k, :].reshape(t, k * h)
        final = want.hidden[:, k, :]
        if fmt == "specforge":
            expected_mask = want.loss_mask.clone()
            expected_mask[-1] = 0  # SpecForge's normalizer zeroes the last position
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids[None])
            assert torch.equal(got["loss_mask"], expected_mask[None])
            assert got["hidden_state"].dtype == torch.bfloat16 and got["hidden_state"].shape == (1, t, k * h)
            assert torch.equal(got["hidden_state"], aux[None])
            assert got["target"].shape == (1, t, h) and torch.equal(got["target"], final[None])
        elif fmt == "modelopt":
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids)
            assert torch.equal(got["loss_mask"], want.loss_mask)
            assert torch.equal(got["labels"][:-1], want.input_ids[1:])
            assert got["base_model_hidden_states"].dtype == torch.bfloat16
            assert got["base_model_hidden_states"].shape == (t, h)
            assert torch.equal(got["base_model_hidden_states"], final)
            assert got["aux_hidden_states"].shape == (t, k * h) and torch.equal(got["aux_hidden_states"], aux)
        else:
            assert got["input_ids"].dtype == torch.int64 and torch.equal(got["input_ids"], want.input_ids)
            assert torch.equal(got["loss_mask"].to(torch.int64), want.loss_mask)
            assert got["hidden_states"].dtype == torch.bfloat16 and got["hidden_states"].shape == (t, k * h)
            assert torch.equal(got["hidden_states"], aux)
            assert torch.equal(got["verifier_last_hidden_states"], final)
    if fmt == "modelopt":
        assert loaded["prenorm"] == [False] * len(entries), "ModelOpt would re-apply the final norm"
    if fmt not in ("specforge", "modelopt"):
        by_key = {e.output_index: e.tokens for e in entries}
        assert loaded["approx_lengths"] == [by_key[key] for key in loaded["keys"]]
