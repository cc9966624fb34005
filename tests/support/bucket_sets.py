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
from support.s3_server import CLIENT_READ_TIMEOUT_S


def target(weed, bucket: str, prefix: str, credentials: Path, uploads: int = 4) -> ObjectOutput:
    settings = settings_from(weed.endpoint, "", str(credentials), read_timeout_s=CLIENT_READ_TIMEOUT_S)
    return ObjectOutput(ObjectURL(bucket, prefix), settings, uploads)


def through(proxy, bucket: str, prefix: str, credentials: Path, attempts: int = 10, **kw) -> ObjectOutput:
    """The bucket prefix reached through `proxy` (support.faulty_store), whose slow answers its
    client gives up on."""
    from support.faulty_store import CLIENT_TIMEOUT_S, FIRST_WAIT_S

    settings = settings_from(
        proxy.url, "", str(credentials), read_timeout_s=CLIENT_TIMEOUT_S, attempts=attempts, first_wait_s=FIRST_WAIT_S
    )
    return ObjectOutput(ObjectURL(bucket, prefix), settings, **{"uploads": 4, **kw})


def drain_config(dump: Path, work: Path, out: ObjectOutput | None, fmt: str = "speculators", **kw) -> DrainConfig:
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


def drain(dump: Path, work: Path, out: ObjectOutput | None, lines: int, fmt: str = "speculators", **kw) -> int:
    finish_client(work, lines)
    return Drainer(drain_config(dump, work, out, fmt, **kw)).run()


def collect_in_place_args(weed, bucket: str, credentials: Path, work: Path, *flags: str) -> list[str]:
    """``hsextract collect`` of `drain_fleet`'s hosts a and b into ``s3://<bucket>/run/set``, in place,
    with `flags` before the hosts (its work directory: ``<work>/set-work``)."""
    into = ["--into", f"s3://{bucket}/run/set", "--work-dir", str(work / "set-work")]
    store = weed.cli_args(credentials)
    return ["collect", *into, *store, *flags, "--", f"a=s3://{bucket}/run/a", f"b=s3://{bucket}/run/b"]


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


def assert_set_is_exact(out: ObjectOutput, expected_indices: set[int]) -> None:
    """Every named sample's object is whole (size and checksum), each dataset index once."""
    store = store_of(out)
    entries = read_published(store).entries
    indices = [e.dataset_index for e in entries]
    assert sorted(indices) == sorted(expected_indices), f"named {sorted(indices)}"
    for e in entries:
        info = store.head(store.url.key(e.file))
        assert info is not None and info.size == e.bytes, f"{e.file}: not whole"
        assert object_checksum(store, e.file, e.checksum.split(":")[0]) == e.checksum


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
    via=None,
    precision: str = "bf16",
    attempts: int = 10,
) -> dict:
    """Hosts of one run, host k drains shard k/len(hosts) of an n-line dataset into s3://bucket/run/<host>,
    as extract.yml's hosts do (through `via`, a support.faulty_store, where given; sample i has
    `tokens` + i % 16 tokens, each request through `via` tried `attempts` times); the staged samples by
    dataset index."""
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
            staged[i] = stage_sample(dump, run, i, tokens=tokens + i % 16, hidden_size=hidden_size)
        summary = client_summary_path(work, Shard(k, len(hosts)))
        summary.parent.mkdir(parents=True, exist_ok=True)
        summary.write_text(json.dumps({"state": "done", "dataset_lines": n, "shard": [k, len(hosts)]}))
        out = (
            target(weed, bucket, f"run/{host}", credentials)
            if via is None
            else through(via, bucket, f"run/{host}", credentials, attempts=attempts)
        )
        assert Drainer(drain_config(dump, work, out, precision=precision)).run() == 0
    return staged


def assert_same_samples(pulled: Path, directory: Path) -> None:
    """The set pulled into `pulled` holds, for every dataset index, the very file and manifest line
    (but its output index) a directory drain of the same dumps wrote into `directory`."""
    from hsextract.output.manifest import iter_entries

    got = {e.dataset_index: e for e in iter_entries(pulled)}
    want = {e.dataset_index: e for e in iter_entries(directory)}
    assert len(got) == len(list(iter_entries(pulled))), "a dataset index pulled twice"
    assert sorted(got) == sorted(want), f"missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}"
    for i, e in got.items():
        w = want[i]
        assert (e.checksum, e.tokens, e.bytes, e.fingerprint) == (w.checksum, w.tokens, w.bytes, w.fingerprint), i
        assert (pulled / e.file).read_bytes() == (directory / w.file).read_bytes(), f"dataset index {i}: bytes differ"
