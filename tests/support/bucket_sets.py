"""What the object-store tests share: a drain of staged dumps into a bucket, and the set read back."""

from __future__ import annotations

import json
from pathlib import Path

from hsextract.drain.core import DrainConfig, Drainer
from hsextract.objectstore.output import ObjectOutput
from hsextract.objectstore.segments import read_published
from hsextract.objectstore.settings import settings_from
from hsextract.objectstore.store import ObjectStore
from hsextract.objectstore.url import ObjectURL
from hsextract.output.manifest import ManifestEntry, new_hasher

from support.drain_proc import finish_client


def target(weed, bucket: str, prefix: str, credentials: Path, uploads: int = 4) -> ObjectOutput:
    return ObjectOutput(ObjectURL(bucket, prefix), settings_from(weed.endpoint, "", str(credentials)), uploads)


def drain_config(dump: Path, work: Path, out: ObjectOutput, fmt: str = "speculators", **kw) -> DrainConfig:
    base = dict(
        dump_dir=dump,
        output=work,
        format=fmt,
        workers=2,
        poll_interval_s=0.05,
        status_interval_s=0.2,
        finalize_idle_s=0.5,
        exit_when_done=True,
        object_store=out,
    )
    base.update(kw)
    return DrainConfig(**base)


def drain(dump: Path, work: Path, out: ObjectOutput, lines: int, fmt: str = "speculators", **kw) -> int:
    finish_client(work, lines)
    return Drainer(drain_config(dump, work, out, fmt, **kw)).run()


def store_of(out: ObjectOutput) -> ObjectStore:
    return ObjectStore(out.url, out.settings)


def published(out: ObjectOutput) -> list[ManifestEntry]:
    return read_published(store_of(out)).entries


def object_checksum(store: ObjectStore, rel: str, algorithm: str) -> str:
    data = store.get_bytes(store.url.key(rel))
    assert data is not None, f"{rel} is not in the bucket"
    h = new_hasher(algorithm)
    h.update(data)
    return f"{algorithm}:{h.hexdigest()}"


def sample_keys(store: ObjectStore, fmt) -> set[str]:
    """The set-relative paths of the objects shaped like sample files."""
    rels = {store.url.rel(i.key) for i in store.list_objects()}
    return {r for r in rels if fmt.file_pattern.match(r)}


def staged_names(dump: Path) -> list[str]:
    return sorted(p.name for p in dump.iterdir() if p.name not in ("_records", "_captures")) if dump.exists() else []


def status_of(work: Path) -> dict:
    return json.loads((work / ".hsextract" / "drain-status.json").read_text())


def drain_fleet(
    weed,
    bucket: str,
    credentials: Path,
    tmp_path: Path,
    hosts: tuple[str, ...] = ("a", "b"),
    n: int = 12,
    hidden_size: int = 64,
    tokens: int = 5,
) -> dict:
    """Hosts of one run, host k drains shard k/len(hosts) of an n-line dataset into s3://bucket/run/<host>,
    as extract.yml's hosts do; the staged samples by dataset index."""
    from hsextract.output.layout import client_summary_path
    from hsextract.output.run_id import load_or_create_run_id
    from hsextract.shard import Shard

    from support.staged_dumps import stage_sample

    works = [tmp_path / f"work-{h}" for h in hosts]
    run = load_or_create_run_id(works[0])
    staged = {}
    for k, (host, work) in enumerate(zip(hosts, works, strict=True)):
        work.mkdir(parents=True, exist_ok=True)
        (work / "run.json").write_text((works[0] / "run.json").read_text())
        dump = tmp_path / f"dump-{host}"
        for i in range(k, n, len(hosts)):
            staged[i] = stage_sample(dump, run, i, tokens=tokens + i, hidden_size=hidden_size)
        summary = client_summary_path(work, Shard(k, len(hosts)))
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"state": "done", "dataset_lines": n, "shard": [k, len(hosts)]}))
        assert Drainer(drain_config(dump, work, target(weed, bucket, f"run/{host}", credentials))).run() == 0
    return staged
