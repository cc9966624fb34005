"""A storm of faults on the real product on a CPU: every dataset line must end in exactly one place.

The real SGLang server (tiny Llama, the capture's writer process), ``hsextract extract`` and
``hsextract drain`` run as the units run them, while faults land at random instants:

* ``kill_client``: kill -9 of the client, often mid-prefill of its long prompts (SGLang aborts
  them; the capture keeps what it had staged), then the client started again;
* ``kill_drain``: kill -9 of the drain, started again;
* ``kill_writer``: kill -9 of the capture's writer process inside the server;
* ``kill_server``: kill -9 of the server's process group, started again on the same port;
* ``timeouts``: the client started again with ``--request-timeout 1``, shorter than its long
  prompts' prefill;
* ``volume_full``: the output volume (a tmpfs of the storm's own) filled to the last page for a few
  seconds, once while samples stream and once when the client has finished and the drain writes
  the dataset-level files.

After the last fault the client and the drain run to the end (a drain that exits otherwise than
done is started again, as its unit's ``Restart=always`` does). The storm passes when the accounts
add up (``accepted = in the set + failed + quarantined``, every line rejected or accepted), nothing is
quarantined or failed, every sample in the set has the dataset's own token ids and loss mask, and
``hsextract finalize --verify`` finds nothing wrong.

    python bench/storm.py --faults 32 --lines 325      # needs root (the tmpfs); about 10 minutes on 2 cores

Results: ``bench/results/storm_cpu.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "files" / "python"), str(REPO / "tests")]

from hsextract.capture.writer_child import CHILD_MODULE  # noqa: E402
from support import client_run  # noqa: E402
from support.sglang_server import free_port, process_tree, start_server  # noqa: E402

KINDS = ("kill_client", "kill_drain", "kill_writer", "kill_server", "timeouts", "volume_full")
WEIGHTS = (6, 6, 3, 1, 2, 1)
MAX_TOKENS = 300  # the client's --max-tokens: long prompts of up to 19 prefill chunks of 16 tokens


class Storm:
    """The product's three processes, restartable, and the faults that land on them."""

    def __init__(self, work: Path, model: Path, dataset: Path, volume: Path):
        self.work, self.model, self.dataset, self.volume = work, model, dataset, volume
        self.out, self.dump, self.logs = volume / "out", work / "dump", work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.port = free_port(32000, 33000)
        self.server = None
        self.client: subprocess.Popen | None = None
        self.drain: subprocess.Popen | None = None
        self.done: list[dict] = []

    def start_server(self) -> None:
        self.server = start_server(
            self.model,
            port=self.port,
            dump_dir=self.dump,
            log_dir=self.logs,
            chunked_prefill_size=16,
            max_total_tokens=8192,
            startup_timeout=600,
        )

    def start_client(self, *extra: str) -> None:
        self.client = client_run.start_client(
            self.logs / "client.log",
            *client_run.extract_args(
                self.server.url,
                self.dataset,
                self.model,
                self.dump,
                self.out,
                "--max-tokens",
                str(MAX_TOKENS),
                "--overlong",
                "skip",
                "--max-in-flight",
                "6",
                "--server-wait",
                "900",
                *extra,
            ),
        )

    def start_drain(self) -> None:
        self.drain = client_run.start_drain(self.logs / "drain.log", self.dump, self.out, self.model)

    def client_finished(self) -> bool:
        return self.client is not None and self.client.poll() is not None

    def fault(self, kind: str) -> dict:
        t0 = time.monotonic()
        what: dict = {"kind": kind}
        if kind == "kill_client":
            what["client_running"] = not self.client_finished()
            client_run.stop(self.client)
            self.start_client()
        elif kind == "timeouts":
            client_run.stop(self.client)
            self.start_client("--request-timeout", "1")
        elif kind == "kill_drain":
            client_run.stop(self.drain)
            self.start_drain()
        elif kind == "kill_writer":
            pids = writer_pids(self.server.proc.pid)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            what["writers_killed"] = len(pids)
        elif kind == "kill_server":
            os.killpg(self.server.proc.pid, signal.SIGKILL)
            self.server.proc.wait()
            self.start_server()
        elif kind == "volume_full":
            what["filled_bytes"] = fill_for(self.volume, 4.0)
        what["s"] = round(time.monotonic() - t0, 1)
        self.done.append(what)
        return what

    def stop_all(self) -> None:
        client_run.stop(self.client)
        client_run.stop(self.drain)
        if self.server is not None:
            self.server.stop()


def writer_pids(server_pid: int) -> list[int]:
    """The capture's writer processes (``python -m hsextract.capture.writer_child``) of this storm's
    server: its own process tree only, never another server's on the machine."""
    found = []
    for pid in process_tree(server_pid):
        with contextlib.suppress(OSError):
            if CHILD_MODULE.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def fill_for(volume: Path, seconds: float) -> int:
    """Fill ``volume`` to its last byte for ``seconds``, then free it; the bytes the filler took."""
    filler = volume / "filler"
    written = 0
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096):  # megabytes while they fit, then the last pages
            with contextlib.suppress(OSError):
                while True:
                    written += os.write(fd, b"\0" * size)
        time.sleep(seconds)
    finally:
        os.close(fd)
        filler.unlink()
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=32)
    ap.add_argument("--lines", type=int, default=325)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gap-s", type=float, default=4.0, help="mean seconds between faults")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "storm_cpu.json")
    args = ap.parse_args()
    from hsextract.tiny_model import ensure_tiny_model
    from transformers import AutoTokenizer

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="hsx-storm-"))
    volume = work / "volume"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", str(volume)], check=True)
    model = ensure_tiny_model("llama", REPO / ".work" / "models" / "llama")
    exp = client_run.write_mixed_dataset(
        work / "data.jsonl", AutoTokenizer.from_pretrained(str(model)), n_lines=args.lines, seed=args.seed, max_words=30
    )
    for index in [i for i, (ids, _) in exp.samples.items() if len(ids) > MAX_TOKENS]:
        exp.rejects[index] = "too_long"  # longer than the client's --max-tokens: skipped, as it should be
        del exp.samples[index]
    storm = Storm(work, model, work / "data.jsonl", volume)
    result: dict = {
        "benchmark": "storm",
        "lines": args.lines,
        "faults_asked": args.faults,
        "seed": args.seed,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    t0 = time.monotonic()
    try:
        storm.start_server()
        storm.start_drain()
        storm.start_client()
        kinds = rng.choices(KINDS, WEIGHTS, k=args.faults)
        for kind in kinds:
            time.sleep(rng.expovariate(1 / args.gap_s))
            print(f"[{time.monotonic() - t0:6.1f}s] {storm.fault(kind)}", flush=True)
        # The dataset-level files on a full volume: fill it once the client has finished.
        client_run.wait_for(storm.client_finished, 1800, "the client to finish", storm.logs / "client.log")
        print(f"[{time.monotonic() - t0:6.1f}s] {storm.fault('volume_full')} (after the client)", flush=True)
        if storm.client.returncode != 0:  # a client killed last, or one that failed: run it to the end
            storm.start_client()
            client_run.wait_exit(storm.client, 1800, storm.logs / "client.log")
        result["client_rc"] = storm.client.returncode
        # As its unit does (Restart=always): a drain that exited otherwise than done is started again.
        result["drain_exits"] = [client_run.wait_exit(storm.drain, 1800, storm.logs / "drain.log")]
        while result["drain_exits"][-1] != 0 and len(result["drain_exits"]) < 4:
            time.sleep(2)
            storm.start_drain()
            result["drain_exits"].append(client_run.wait_exit(storm.drain, 1800, storm.logs / "drain.log"))
        result["drain_rc"] = result["drain_exits"][-1]
        result.update(check(storm, exp))
        result["ok"] = result["ok"] and result["client_rc"] == 0 and result["drain_rc"] == 0
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["ok"] = False
    finally:
        result["faults"] = storm.done
        result["by_kind"] = {k: sum(f["kind"] == k for f in storm.done) for k in KINDS}
        result["wall_s"] = round(time.monotonic() - t0, 1)
        storm.stop_all()
        subprocess.run(["umount", "-l", str(volume)], check=False)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "faults"}, indent=1))
    return 0 if result.get("ok") else 1


def check(storm: Storm, exp) -> dict:
    """The storm's verdict: the accounts, the samples against the dataset, the verify."""
    from hsextract.output.accounts import read_accounts

    accounts = read_accounts(storm.out, storm.out / "quarantine", final=True)
    acc = accounts.as_dict() if accounts else {}
    problems = []
    try:
        client_run.assert_training_set_matches(storm.out, exp)
    except AssertionError as exc:
        problems.append(str(exc))
    verify = subprocess.run(
        [sys.executable, "-m", "hsextract", "finalize", "--output", str(storm.out), "--verify"],
        env=client_run.env(),
        capture_output=True,
        text=True,
    )
    if verify.returncode != 0:
        problems.append(f"verify: {verify.stdout[-1500:]}")
    rejected = sum((acc.get("rejected") or {}).values())
    if rejected != len(exp.rejects):
        problems.append(f"{rejected} lines rejected, the dataset has {len(exp.rejects)} to reject")
    ok = (
        not problems
        and acc.get("in_set") == acc.get("accepted") == len(exp.samples)
        and not acc.get("failed")
        and not acc.get("quarantined")
        and not acc.get("unaccounted")
    )
    return {"ok": ok, "accounts": acc, "problems": problems, "verify_rc": verify.returncode}


if __name__ == "__main__":
    raise SystemExit(main())
