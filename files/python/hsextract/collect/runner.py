"""One collect, start to end: the order of the steps, each done by its own module.

1. Take the collected set's lock; repair what a killed collect left (a torn manifest line, files
   past the manifest's end, temporary files).
2. Read every host output; admit those of this training set, refuse the others by name.
3. Plan what is missing, in dataset-index order; fail the rows whose files have another row's
   bytes; fetch and verify the rest in parallel, commit it in order, batch by batch; record what
   failed verification.
4. Write the fleet's bookkeeping, the dataset-level files, the card and the report; reconcile.

Every step is safe to kill at any instant and to repeat: what is committed is never rewritten,
what is not is done again, and files are replaced only when their bytes change.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path

from hsextract.collect.admit import Admission, admit, choose_reference, same_header
from hsextract.collect.bookkeeping import write_identity
from hsextract.collect.config import CollectConfig, Collected, CollectResult
from hsextract.collect.failures import FailureJournal
from hsextract.collect.hosts import HostOutput, HostUnreadable, read_clients, read_host
from hsextract.collect.into import check_into, mark
from hsextract.collect.lock import collected_set_lock
from hsextract.collect.report import finish, nothing_admitted
from hsextract.collect.selection import Selection, collected_entry, select_entries
from hsextract.collect.space import SpacePolicy
from hsextract.collect.transfer import Fetched, Fetcher, same_filesystem
from hsextract.durable import check_writable
from hsextract.errors import ConfigError
from hsextract.formats import get_format
from hsextract.formats.sample_check import SampleCheck
from hsextract.formats.to_bf16 import Bf16Conversion, bf16_conversion
from hsextract.output.collect_reasons import SAME_BYTES
from hsextract.output.commit import OrderedCommit, ToCommit, stop_short
from hsextract.output.dataset_record import read_record
from hsextract.output.layout import collect_tmp_dir
from hsextract.output.manifest import (
    ManifestEntry,
    ManifestError,
    ManifestHeader,
    iter_entries,
    read_header,
    write_header,
)
from hsextract.output.repair import clear_temporary, remove_orphans, repair_torn_tail
from hsextract.output.same_bytes import describe, host_row_name, row_name, same_bytes

log = logging.getLogger("hsextract.collect")

BATCH = 32  # samples fetched in parallel, then committed together (one manifest fsync)


def check_arguments(cfg: CollectConfig) -> None:
    """Refuse what cannot be a collect before anything is read: no host, a name or path twice,
    the collected set inside a host output (or one inside it)."""
    if not cfg.hosts:
        raise ConfigError("collect needs at least one host output (PATH or NAME=PATH)")
    if cfg.link and cfg.move:
        raise ConfigError("--link and --move: give one of them, or neither (the samples are then copied)")
    if cfg.link and cfg.to_bf16:
        raise ConfigError(
            "--link and --to-bf16: a converted sample is a new file, not the host's; collect without --link"
        )
    if (cfg.format or cfg.model) and not cfg.to_bf16:
        raise ConfigError("--format and --model choose what --to-bf16 writes: give --to-bf16 with them")
    names = [n for n, _ in cfg.hosts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"host name(s) {', '.join(twice)} given twice: name each host output once (NAME=PATH)")
    into = cfg.into.resolve()
    seen: dict[Path, str] = {}
    for name, path in cfg.hosts:
        real = path.resolve()
        if real in seen:
            raise ConfigError(f"hosts {seen[real]} and {name} are the same directory {real}: give each output once")
        seen[real] = name
        if into == real or into.is_relative_to(real) or real.is_relative_to(into):
            raise ConfigError(
                f"the collected set {into} and host {name}'s output {real} lie inside each other: "
                "collect into a directory of its own"
            )


def collect(cfg: CollectConfig) -> CollectResult:
    check_arguments(cfg)
    out = cfg.into
    check_into(out)  # before the lock: it is a file of ours in that directory
    check_writable(out, "collected set", "--into")
    with collected_set_lock(out):
        return _collect_locked(cfg, out)


def _collect_locked(cfg: CollectConfig, out: Path) -> CollectResult:
    notes: list[str] = []
    entries = list(iter_entries(out))  # a torn last line is not read (and cut below, once a host is admitted)
    if [e.output_index for e in entries] != list(range(len(entries))):
        raise ManifestError(f"{out}/manifest.jsonl: output indices are not 0, 1, 2...: was it edited?")
    header = read_header(out)
    if header is None and entries:
        raise ManifestError(f"{out}: manifest.jsonl has entries but manifest.json is missing; restore it")
    hosts, unreadable = _read_hosts(cfg)
    fleet_lines = next((c.dataset_lines for c in read_clients(out)), None)
    ref = choose_reference(header, read_record(out), fleet_lines, hosts)
    if cfg.to_bf16 and header is not None and header.precision != "bf16":
        raise ConfigError(
            f"--to-bf16: the collected set {out} holds {header.precision} rows; "
            "collect the bf16 set into a new directory"
        )
    headers = [ref.header, *(h.header for h in hosts)]
    conversion = _conversion(cfg, [h for h in headers if h is not None])
    as_collected = conversion.header_of if conversion is not None else same_header
    adm = admit(hosts, ref, final=cfg.final, move=cfg.mode == "move", as_collected=as_collected)
    adm.refused[:0] = unreadable
    if not adm.admitted:  # nothing to add: the set, its bookkeeping and its report stay as they are
        return nothing_admitted(Collected(cfg, ref, None, entries, adm))
    mark(out)
    if repair_torn_tail(out):
        notes.append("cut off a torn last manifest line left by a killed collect")
    if ref.header is None:
        return finish(Collected(cfg, ref, None, entries, adm, notes=notes))
    host_headers = {h.name: h.header or ref.header for h in adm.admitted}
    set_header = as_collected(ref.header)  # FP8 rows converted: the collected set's are bf16 ones
    ref = replace(ref, header=set_header)
    fmt = get_format(set_header.format)
    removed = remove_orphans(out, fmt.relative_path, len(entries))
    if removed:
        notes.append(f"removed {len(removed)} file(s) a killed collect renamed but never recorded")
    clear_temporary(collect_tmp_dir(out))
    fetcher = _fetcher(cfg, out, adm, host_headers, conversion)
    plan = select_entries(entries, {h.name: h.entries for h in adm.admitted})
    fetcher.release(plan.already)  # --move: files a killed collect committed but had not removed yet
    write_identity(out, set_header.run_id, ref.dataset)
    if header is None and plan.pending:
        write_header(out, set_header)
    journal = FailureJournal(out)
    journal.record(_fail_twins(plan, entries, fetcher), SpacePolicy(out, cfg.wait_for_space_s))
    new = _fetch_and_commit(cfg, out, fmt, len(entries), plan, fetcher, journal)
    done = Collected(cfg, ref, fmt, entries + new, adm, plan, len(new), notes, journal)
    return SpacePolicy(out, cfg.wait_for_space_s).retrying(
        lambda: finish(done), "the set's bookkeeping, dataset-level files and card are still to write"
    )


def _fail_twins(plan: Selection, collected: list[ManifestEntry], fetcher: Fetcher) -> list[Fetched]:
    """The pending samples whose file has the bytes of another row's, collected or pending: one of
    them holds another sample's file and nothing tells which, so none is fetched
    (hsextract.output.same_bytes); they fail, and leave the plan. A row that names another file
    than its own is its own failure (`Fetcher.refusal`), and no twin of the row whose file it names."""
    named_right = [p for p in plan.pending if fetcher.refusal(p) is None]
    names = {id(e): row_name(e) for e in collected}
    names.update({id(p.entry): host_row_name(p.host, p.entry) for p in named_right})
    twins = same_bytes([*collected, *(p.entry for p in named_right)])
    failed = [
        Fetched(p, reason=SAME_BYTES, detail=describe([names[id(o)] for o in twins[id(p.entry)]], p.entry.checksum))
        for p in plan.pending
        if id(p.entry) in twins
    ]
    plan.pending = [p for p in plan.pending if id(p.entry) not in twins]
    return failed


def _read_hosts(cfg: CollectConfig) -> tuple[list[HostOutput], list[str]]:
    hosts, unreadable = [], []
    for name, path in cfg.hosts:
        try:
            hosts.append(read_host(name, path, stale_after_s=cfg.stale_after_s))
        except HostUnreadable as exc:
            unreadable.append(f"host {name} refused: {exc}; nothing of it was collected")
    return hosts, unreadable


def _conversion(cfg: CollectConfig, headers: list[ManifestHeader]) -> Bf16Conversion | None:
    """What --to-bf16 makes of the hosts' FP8 rows (None: no host holds any, or no --to-bf16), made
    for the first FP8 set of `headers` (the reference's first: the model is checked against it)."""
    fp8 = next((h for h in headers if h.precision == "fp8"), None)
    if cfg.to_bf16 and fp8 is None and cfg.format and any(h.format != cfg.format for h in headers):
        raise ConfigError(
            f"--to-bf16 --format {cfg.format}: no host holds FP8 rows, and --format chooses the format of bf16 "
            "files made of FP8 rows; a bf16 set keeps its format (drain the run in that format)"
        )
    if not cfg.to_bf16 or fp8 is None:
        return None
    return bf16_conversion(fp8, cfg.format, cfg.model, "collect --to-bf16")


def _fetcher(
    cfg: CollectConfig,
    out: Path,
    adm: Admission,
    headers: dict[str, ManifestHeader],
    conversion: Bf16Conversion | None,
) -> Fetcher:
    same = {h.name: same_filesystem(h.path, out) for h in adm.admitted}
    if cfg.mode == "link":
        other = [h for h in adm.admitted if not same[h.name]]
        if other:
            h = other[0]
            raise ConfigError(
                f"--link: host {h.name}'s output {h.path} is on another filesystem than the collected set {out} "
                f"(device {os.stat(h.path).st_dev} versus {os.stat(out).st_dev}), and hard links cannot cross "
                "filesystems. Collect without --link (a copy), or into a directory on that filesystem"
            )
    # each host's rows checked as its own set holds them (FP8 rows in the FP8 set's format)
    checks = {name: SampleCheck(get_format(header.format), header) for name, header in headers.items()}
    return Fetcher(cfg.mode, collect_tmp_dir(out), {h.name: h.path for h in adm.admitted}, same, checks, conversion)


def _fetch_and_commit(
    cfg: CollectConfig, out: Path, fmt, count: int, plan: Selection, fetcher: Fetcher, journal: FailureJournal
) -> list[ManifestEntry]:
    """Fetch the plan's samples BATCH at a time in parallel and commit each batch in plan order;
    on a full volume, what precedes the first sample that found no room is committed, then the
    collect stops (or waits, and goes on from that sample)."""
    space = SpacePolicy(out, cfg.wait_for_space_s)
    committer = OrderedCommit(out, fmt.relative_path, count, stop_short)  # the runner waits, or stops, below
    pending, new, k = plan.pending, [], 0
    last_log = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, cfg.workers), thread_name_prefix="collect") as pool:
            while k < len(pending):
                results: list[Fetched] = list(
                    pool.map(lambda a: fetcher.fetch(*a), enumerate(pending[k : k + BATCH], start=k))
                )
                done, settled, full = _commit_batch(results, committer, journal, fetcher, space)
                new += done
                k += settled
                if full is not None:
                    space.handle(full, f"{len(pending) - k} sample(s), {plan.bytes_to_fetch(k)} bytes, still to fetch")
                if time.monotonic() - last_log >= 10:
                    log.info("collect: %d of %d samples fetched", k, len(pending))
                    last_log = time.monotonic()
    finally:
        committer.close()
    return new


def _commit_batch(
    results: list[Fetched], committer: OrderedCommit, journal: FailureJournal, fetcher: Fetcher, space: SpacePolicy
) -> tuple[list[ManifestEntry], int, OSError | None]:
    """Commit a fetched batch in order up to the first sample that found no room; record the
    failures before it. Returns the entries committed, how many results are settled (committed
    or failed), and the full-volume error that stopped it (None when none did)."""
    cut = next((j for j, r in enumerate(results) if r.no_space), len(results))
    full = results[cut].no_space if cut < len(results) else None
    for r in results[cut:]:  # fetched again after the wait: their space is needed now
        if r.tmp is not None:
            r.tmp.unlink(missing_ok=True)
    ok = [r for r in results[:cut] if r.tmp is not None]
    done, commit_full = committer.commit([_to_commit(r) for r in ok])
    if len(done) < len(ok):
        full = commit_full
        for r in ok[len(done) :]:
            r.tmp.unlink(missing_ok=True)  # type: ignore[union-attr]
        cut = next(j for j, r in enumerate(results) if r is ok[len(done)])
    journal.record([r for r in results[:cut] if r.tmp is None], space)
    fetcher.release([r.pending for r in ok[: len(done)]])
    return done, cut, full


def _to_commit(r: Fetched) -> ToCommit:
    """A verified sample's temporary file, and its row in the collected set once it has its place."""
    assert r.tmp is not None
    return ToCommit(r.tmp, partial(collected_entry, r.pending, converted=r.converted))
