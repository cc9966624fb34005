"""Host outputs of a fleet run, written by the real drain, for the collect tests (no server needed).

Each host takes shard i/n of one dataset and records what a client records: the run id shared by
the fleet (``run.json``), the dataset's fingerprint (``.hsextract/dataset.json``, the client's own
`check_and_record`), its rejects and failures, and its summary (or, while it is still extracting,
its status). Its samples are staged exactly as the capture stages them (`stage_sample`) and written
by the drain (`Drainer`, as ``hsextract drain --exit-when-done`` runs it); a sample whose record
disagrees with its dump is quarantined by that drain.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from hsextract.drain.config import DrainConfig
from hsextract.drain.core import Drainer
from hsextract.formats import FORMATS
from hsextract.model_info import read_model_info
from hsextract.output.dataset_record import check_and_record
from hsextract.output.layout import client_status_path, client_summary_path, failures_path, rejects_path
from hsextract.shard import WHOLE, Shard
from hsextract.staging.records import SampleRecord, make_rid, write_record

from support.staged_dumps import Staged, stage_sample

RUN_ID = "c011ec70"
VOCAB_SIZE = 1000  # stage_sample draws token ids below 1000
DRAFT_SIZES = (16, 64)


def tokens_of(index: int) -> int:
    return 5 + index % 9


def write_dataset(path: Path, lines: int, tag: str = "") -> Path:
    """A JSONL dataset of `lines` conversations (only its fingerprint and size matter here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"question {tag}{i}"},
                {"role": "assistant", "content": f"answer {tag}{i}"},
            ]
        }
        for i in range(lines)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@dataclass
class HostPlan:
    """What one host's shard holds: the indices rejected, failed and quarantined; the rest are written."""

    name: str
    shard: Shard
    rejected: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    quarantined: set[int] = field(default_factory=set)
    # client processes that extracted the shard (hsextract extract --process j/P): each writes its
    # own client files, of its sub-shard; `ran` lists those that did (default: all of them)
    processes: int = 1
    ran: tuple[int, ...] | None = None

    def client_shards(self) -> list[Shard]:
        """The shards whose clients wrote files: the host's, or the sub-shards of the processes that ran."""
        if self.processes == 1:
            return [self.shard]
        return [self.shard.sub_shard((j, self.processes)) for j in (self.ran or range(self.processes))]


def _append_jsonl(path: Path, objs: Iterable[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(o) + "\n" for o in objs)


def write_client_files(out: Path, shard: Shard, lines: int, *, finished: bool, named: bool = False) -> None:
    """The client's summary (finished) or status (still extracting) of shard `shard` of a `lines`-line
    dataset; `named`: under the shard's own names, as one of several clients of an output writes them."""
    body = {"state": "done" if finished else "running", "dataset_lines": lines, "shard": shard.to_json()}
    tag = shard if named else WHOLE
    keep, drop = (client_summary_path(out, tag), client_status_path(out, tag))[:: 1 if finished else -1]
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_text(json.dumps(body))
    drop.unlink(missing_ok=True)


def drain_host(
    out: Path,
    dump: Path,
    fmt: str,
    plan: HostPlan,
    lines: int,
    indices: Iterable[int],
    *,
    run_id: str = RUN_ID,
    finished: bool = True,
    model: Path | None = None,
    precision: str = "bf16",
) -> dict[int, Staged]:
    """Stage the host's samples of `indices` (those of its shard), drain them with the real drain
    (given ``--model model`` when there is one), and record the client's files; return the staged
    samples written, by dataset index."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps({"run_id": run_id}))
    final_hidden = FORMATS[fmt].final_hidden
    written: dict[int, Staged] = {}
    rejects, failures = [], []
    for x in indices:
        if x in plan.rejected:
            rejects.append({"index": x, "line": x + 1, "file": "train.jsonl", "reason": "empty_turn"})
        elif x in plan.failed:
            failures.append({"index": x, "rid": make_rid("hsx", run_id, x), "reason": "capture_failed"})
        else:
            s = stage_sample(dump, run_id, x, tokens_of(x), final_hidden=final_hidden)
            if x in plan.quarantined:  # the client's record names other tokens than the server ran
                write_record(
                    dump,
                    SampleRecord(
                        rid=s.rid,
                        index=x,
                        input_ids=[t + 1 for t in s.input_ids.tolist()],
                        loss_mask=s.loss_mask.tolist(),
                        run_id=run_id,
                    ),
                )
            else:
                written[x] = s
    clients = plan.client_shards()
    named = plan.processes > 1
    for client in clients:
        tag = client if named else WHOLE
        _append_jsonl(rejects_path(out, tag), [r for r in rejects if client.takes(r["index"])])
        _append_jsonl(failures_path(out, tag), [f for f in failures if client.takes(f["index"])])
    # The drain's --exit-when-done waits for a finished client; a host still extracting gets its
    # status back once the drain has written what was staged.
    for shard in clients:
        write_client_files(out, shard, lines, finished=True, named=named)
    cfg = DrainConfig(
        dump_dir=dump,
        output=out,
        format=fmt,
        precision=precision,
        workers=2,
        poll_interval_s=0.05,
        status_interval_s=0.2,
        exit_when_done=True,
        max_failure_share=1.0,
        vocab_size=VOCAB_SIZE,
        draft_vocab_sizes=DRAFT_SIZES,
        selfcheck_share=0.0,
        selfcheck_first=0,
    )
    if model is not None:  # as `hsextract drain --model` sets them
        info = read_model_info(model)
        cfg.model_path, cfg.model_config_sha256, cfg.architecture = str(model), info.config_sha256, info.architecture
    Drainer(cfg).run()
    if not finished:
        for shard in clients:
            write_client_files(out, shard, lines, finished=False, named=named)
    return written


@dataclass
class Fleet:
    """Host outputs of one run over one dataset, and what each sample was."""

    fmt: str
    lines: int
    dataset: Path
    hosts: dict[str, Path]
    plans: dict[str, HostPlan]
    samples: dict[int, Staged]  # dataset index -> the staged sample, for every sample a host wrote

    def args(self, *names: str) -> list[str]:
        """``NAME=PATH`` arguments of the hosts `names` (default all), in order."""
        return [f"{n}={self.hosts[n]}" for n in (names or self.hosts)]

    def copy(self, dst: Path) -> Fleet:
        """The same fleet in another directory, to change without touching this one."""
        hosts = {}
        for name, path in self.hosts.items():
            hosts[name] = dst / name
            shutil.copytree(path, hosts[name], symlinks=True)
        return Fleet(self.fmt, self.lines, self.dataset, hosts, self.plans, dict(self.samples))


def make_fleet(
    root: Path, fmt: str, plans: list[HostPlan], lines: int, *, dataset: Path | None = None, precision: str = "bf16"
) -> Fleet:
    """Every host of `plans` drained in full into ``root/<name>`` (its rows stored in `precision`)."""
    dataset = dataset or write_dataset(root / "train.jsonl", lines)
    hosts, samples = {}, {}
    for plan in plans:
        out = root / plan.name
        out.mkdir(parents=True)
        check_and_record(out, dataset, has_samples=False)
        indices = sorted({x for s in plan.client_shards() for x in s.indices(lines)})
        samples.update(drain_host(out, root / f"dump-{plan.name}", fmt, plan, lines, indices, precision=precision))
        hosts[plan.name] = out
    return Fleet(fmt, lines, dataset, hosts, {p.name: p for p in plans}, samples)


def three_hosts() -> list[HostPlan]:
    """Shards 0/3, 1/3, 2/3, each with something rejected, failed or quarantined."""
    return [
        HostPlan("a", Shard(0, 3), rejected={3}),
        HostPlan("b", Shard(1, 3), failed={4}),
        HostPlan("c", Shard(2, 3), quarantined={5}),
    ]


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every file under `root` (but lock files, which each run opens): (inode, mtime ns, size)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".lock"):
                continue
            p = Path(dirpath) / name
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return out
