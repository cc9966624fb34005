"""Capture overhead: prefill throughput with and without the project's capture, side by side.

A stand-in prefill at Kimi-K2.5 / DeepSeek-V3 width (hidden 7168, dense layers with a
18432-wide MLP, 8192-token batches, bf16) drives the project's own capture (`CapturePlanner` +
`CaptureWriter`, exactly as the SGLang hook calls them): each forward packs 3 aux layers the way
SGLang's ``AuxHiddenStatePacker`` does, and the hook hands aux + final hidden state to the writer,
which stages one 8192-token request per batch into /dev/shm (57 KB per token). A drain stand-in
deletes completed dumps so the ramdisk does not fill.

Printed from one run (and saved as JSON):
* tokens/s without capture, with capture, and their ratio (the target is >= 0.95);
* GB/s written to /dev/shm while capturing;
* the original patch's way for comparison: ``.cpu()`` then ``torch.save`` per layer inside forward.

The time with capture includes waiting for every queued write to land (``flush``), so a writer
that falls behind cannot hide in the numbers. Runs on CPU at a small size for a syntax check:
``python bench/capture_overhead.py --device cpu --hidden 256 --tokens 512 --iters 3``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "files" / "python"))

from hsextract.capture.core import BatchRequest, CaptureSettings
from hsextract.capture.writer import CaptureWriter
from hsextract.layers import resolve
from hsextract.staging.dumps import iter_complete, read_states


class Layer(torch.nn.Module):
    """A dense decoder layer's matmul volume (attention projections + gated MLP)."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.qkvo = torch.nn.Linear(hidden, 4 * hidden, bias=False)
        self.up = torch.nn.Linear(hidden, 2 * inter, bias=False)
        self.down = torch.nn.Linear(inter, hidden, bias=False)
        self.hidden = hidden

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.qkvo(h)[:, : self.hidden]
        g, u = self.up(h).chunk(2, -1)
        return h + self.down(torch.nn.functional.silu(g) * u)


class StandIn(torch.nn.Module):
    def __init__(self, layers: int, hidden: int, inter: int, capture_at: list[int]):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(hidden, inter) for _ in range(layers)])
        self.norm = torch.nn.RMSNorm(hidden)
        self.capture_at = capture_at  # SGLang convention: residual entering layer i

    def forward(self, h: torch.Tensor, capture: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed = h.new_empty(h.shape[0], len(self.capture_at) * h.shape[1]) if capture else None
        for i, layer in enumerate(self.layers):
            if capture and i in self.capture_at:
                k = self.capture_at.index(i)
                packed[:, k * h.shape[1] : (k + 1) * h.shape[1]].copy_(h)
            h = layer(h)
        return self.norm(h), packed


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=18432)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sync-iters", type=int, default=4, help="iterations of the slow reference way")
    ap.add_argument("--writer-threads", type=int, default=8)
    ap.add_argument("--in-flight-gib", type=float, default=4.0)
    ap.add_argument("--slice-mib", type=float, default=32.0, help="rows per writer task, in MiB")
    ap.add_argument("--shm", default="/dev/shm")
    ap.add_argument("--out", default=None, help="JSON result path (default: bench/results/capture_overhead.json)")
    args = ap.parse_args()

    device = torch.device(args.device)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    layers = resolve(None, args.layers, "eagle")  # EAGLE-3 default aux layers for this depth
    capture_at = list(layers.sglang_layers_to_capture)
    with torch.device(device):  # initialise on the device: 4.8 G parameters are slow to init on a CPU
        model = StandIn(args.layers, args.hidden, args.inter, capture_at).to(dtype)
    x = torch.randn(args.tokens, args.hidden, device=device, dtype=dtype)
    input_ids = torch.randint(0, 32000, (args.tokens,), device=device)
    prompt_lens = torch.tensor([args.tokens], device=device, dtype=torch.int32)
    bytes_per_batch = args.tokens * (len(capture_at) + 1) * args.hidden * 2
    root = Path(tempfile.mkdtemp(prefix="hsx-bench-", dir=args.shm))
    res: dict[str, object] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "hidden": args.hidden,
        "layers": args.layers,
        "tokens_per_forward": args.tokens,
        "sglang_layers_to_capture": capture_at,
        "slots_per_token": len(capture_at) + 1,
        "bytes_per_token": bytes_per_batch // args.tokens,
        "writer_threads": args.writer_threads,
        "in_flight_gib": args.in_flight_gib,
        "slice_mib": args.slice_mib,
        "iters": args.iters,
        "requests_per_forward": 1,
    }

    def timed(step, iters: int, finish=None) -> float:
        step(-1)
        sync(device)
        if finish:
            finish()
        t0 = time.perf_counter()
        for i in range(iters):
            step(i)
        sync(device)
        if finish:
            finish()
        return iters * args.tokens / (time.perf_counter() - t0)

    with torch.no_grad():
        # 1. no capture
        base = timed(lambda i: model(x, capture=False), args.iters)

        # 2. the project's capture
        settings = CaptureSettings(
            rid_prefix="hsx",
            layers=layers,
            hidden_size=args.hidden,
            dtype="bfloat16",
            final_hidden="post_norm",
            architecture="StandIn",
        )
        writer = CaptureWriter(
            root / "dump",
            settings,
            device=device,
            num_threads=args.writer_threads,
            max_bytes_in_flight=int(args.in_flight_gib * (1 << 30)),
            slice_bytes=int(args.slice_mib * (1 << 20)),
        )
        # A server fills its pinned pool on the first batches; do it before timing.
        bufs = [
            writer.pool.acquire(bytes_per_batch + 16 * args.tokens)
            for _ in range(max(1, min(4, int(args.in_flight_gib * (1 << 30)) // (bytes_per_batch + 1))))
        ]
        for b in bufs:
            writer.pool.release(b)
        # The staged bytes must be the device's bytes: check one batch before timing.
        final, packed = model(x, capture=True)
        writer.submit([BatchRequest("hsx-00000000-0", 0, 0, args.tokens, 0)], packed, final, input_ids, prompt_lens)
        writer.flush()
        staged = read_states(root / "dump" / "hsx-00000000-0")
        expect = torch.cat([packed.view(args.tokens, -1, args.hidden), final.view(args.tokens, 1, args.hidden)], 1)
        res["staged_rows_equal_device_rows"] = bool(torch.equal(staged.hidden, expect.cpu())) and bool(
            torch.equal(staged.input_ids, input_ids.cpu())
        )
        del staged
        if not res["staged_rows_equal_device_rows"]:
            print("ERROR: staged rows differ from the device rows", file=sys.stderr)
        stop = threading.Event()

        def drain() -> None:  # the drain's deletion of staged dumps, so /dev/shm never fills
            while not stop.is_set():
                for d in list(iter_complete(root / "dump")):
                    shutil.rmtree(d, ignore_errors=True)
                time.sleep(0.01)

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        counter = [0]

        def captured_step(i: int) -> None:
            final, packed = model(x, capture=True)
            counter[0] += 1
            req = [BatchRequest(f"hsx-00000000-{counter[0]}", 0, 0, args.tokens, 0)]
            writer.submit(req, packed, final, input_ids, prompt_lens)

        w0 = writer.bytes_written
        t0 = time.perf_counter()
        cap = timed(captured_step, args.iters, finish=lambda: writer.flush())
        wall = time.perf_counter() - t0
        written = writer.bytes_written - w0
        res.update(
            base_tok_s=base,
            capture_tok_s=cap,
            ratio=cap / base,
            written_GBps=written / wall / 1e9 if wall else 0.0,
            capture_blocked_s=writer.pool.blocked_seconds,
            capture_blocked_count=writer.pool.blocked_count,
            requests_done=writer.requests_done,
            write_errors=writer.write_errors,
        )
        writer.close()
        stop.set()
        drainer.join(timeout=5)
        shutil.rmtree(root / "dump", ignore_errors=True)

        # 3. the original patch's way: per-layer .cpu() + torch.save inside forward
        sync_dir = root / "sync"
        sync_dir.mkdir()

        def sync_step(i: int) -> None:
            final, packed = model(x, capture=True)
            d = sync_dir / f"req_{i + 1}"
            d.mkdir(exist_ok=True)
            k = len(capture_at)
            for j in range(k):
                torch.save(packed[:, j * args.hidden : (j + 1) * args.hidden].cpu(), d / f"layer{j}.pt")
            torch.save(final.cpu(), d / "final.pt")
            (d / "done").touch()
            shutil.rmtree(d)

        sync_tok = timed(sync_step, args.sync_iters)
        res.update(sync_tok_s=sync_tok, sync_ratio=sync_tok / base)
    shutil.rmtree(root, ignore_errors=True)

    print(json.dumps(res, indent=1))
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / "capture_overhead.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / "capture_overhead.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
