"""One regeneration run: read the dataset, skip what is done, regenerate the rest over every server.

The dataset is read through the same reader as ``hsextract extract`` (every shape it reads), in
the event loop, at most one conversation ahead of each free worker. Each server gets
``concurrency`` workers; a conversation stays on one server for all its turns, so the server's
prefix cache holds its history. What a run writes (see `store`) is the only state: a restart
skips every key already in the output or errors file, so kill -9 at any moment loses nothing
and does nothing twice. A stop request (SIGTERM) abandons the conversations in flight (the next
run does them); a server that stays down hands its conversations back to the others, and the run
fails (exit 75, resumable) only when every server is gone.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsextract.dataset.reader import DatasetReader, Reject, Sample, count_rows, dataset_files, read_dataset
from hsextract.durable import atomic_write_json
from hsextract.errors import ConfigError, HsextractError
from hsextract.output.layout import regen_status_path, regen_summary_path
from hsextract.regen import core, reasoning
from hsextract.regen.config import RegenConfig
from hsextract.regen.progress import RegenStats, Reporter
from hsextract.regen.sampling import Sampling, resolve
from hsextract.regen.server import ChatServer, ServerGone
from hsextract.regen.store import Store, conversation_key

log = logging.getLogger("hsextract.regen")

PRE_TOKENIZED = "pre_tokenized"
DUPLICATE_ID = "duplicate_id"


@dataclass
class _Work:
    sample: Sample
    key: str


class RegenerateRun:
    """A regeneration run; `run()` returns the stats or raises HsextractError (every server gone, bad setup)."""

    def __init__(self, cfg: RegenConfig, stop: threading.Event | None = None):
        if not cfg.servers:
            raise ConfigError("hsextract regenerate needs at least one --server")
        if cfg.reasoning not in reasoning.MODES:
            raise ConfigError(f"reasoning mode {cfg.reasoning!r}; expected one of {', '.join(reasoning.MODES)}")
        if cfg.concurrency < 1:
            raise ConfigError(f"concurrency {cfg.concurrency}: must be at least 1")
        dataset_files(cfg.dataset)  # a missing or unusable dataset stops the run before anything else
        src, dst = Path(cfg.dataset).resolve(), Path(cfg.output).resolve()
        if dst == src or src in dst.parents:
            raise ConfigError(
                f"output {cfg.output} is inside the dataset {cfg.dataset}: the run would read what it "
                "writes; put the regenerated dataset somewhere else"
            )
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.stats = RegenStats()
        self.store = Store(cfg.output)
        self.opts = core.Options(cfg.reasoning, cfg.last_turn_only, cfg.drop_truncated)
        self.sampling: Sampling | None = None
        self.fatal: BaseException | None = None

    # -- outcomes ---------------------------------------------------------------------------------

    def _record(self, work: _Work, result: core.Result, server: str) -> dict[str, Any]:
        s = work.sample
        where = {"index": s.index, "file": s.file, "line": s.line}
        if not result.ok:
            return {"key": work.key, **where, "reason": result.reason, "detail": result.detail}
        messages = [m.to_openai() for m in result.messages]
        for t in result.truncated:
            messages[t]["truncated"] = True
        out: dict[str, Any] = {"key": work.key}
        if s.id is not None:
            out["id"] = s.id
        out["messages"] = messages
        if s.tools:
            out["tools"] = list(s.tools)
        out["regenerated"] = {
            **where,
            "turns": result.turns,
            "truncated": len(result.truncated),
            "cut": result.cut,
            "completion_tokens": result.completion_tokens,
            "server": server,
        }
        return out

    async def _write(self, record: dict[str, Any], ok: bool) -> None:
        fn = self.store.write_ok if ok else self.store.write_error
        await asyncio.get_running_loop().run_in_executor(self._writer, fn, record)

    async def _reject(self, rej: Reject | Sample, key: str, reason: str, detail: str) -> None:
        await self._write(
            {"key": key, "index": rej.index, "file": rej.file, "line": rej.line, "reason": reason, "detail": detail},
            ok=False,
        )
        self.stats.record_failed(reason)

    # -- the producer and the workers ------------------------------------------------------------

    async def _produce(self) -> None:
        seen: set[str] = set()
        # a prompt without a reply gets one
        reader = DatasetReader(require_assistant=False, max_row_bytes=self.cfg.max_row_bytes)
        for item in read_dataset(self.cfg.dataset, reader):
            if not self.cfg.shard.takes(item.index):
                continue
            if isinstance(item, Reject):
                key = f"row:{item.file}:{item.line}"
                if key in self.store.done:
                    self.stats.skipped += 1
                else:
                    await self._reject(item, key, item.reason, item.detail)
                continue
            if item.is_tokenized:
                key = f"row:{item.file}:{item.line}"
                if key in self.store.done:
                    self.stats.skipped += 1
                else:
                    why = "a pre-tokenized row has no conversation to regenerate"
                    await self._reject(item, key, PRE_TOKENIZED, why)
                continue
            key = conversation_key(item.conversation())
            if key in seen:
                dup = f"row:{item.file}:{item.line}"
                if dup in self.store.done:
                    self.stats.skipped += 1
                else:
                    await self._reject(item, dup, DUPLICATE_ID, f"id {item.id!r} is also the id of an earlier row")
                continue
            seen.add(key)
            if key in self.store.done:
                self.stats.skipped += 1
                continue
            await self._slots.acquire()  # at most one conversation waiting per free worker
            self._queue.put_nowait(_Work(item, key))

    async def _worker(self, server: ChatServer) -> None:
        while not server.gone:
            work = await self._queue.get()
            self._slots.release()
            st = self.stats
            st.in_flight += 1
            try:
                result = await core.regenerate(work.sample.conversation(), server.complete, self.opts)
            except ServerGone as exc:
                self._queue.put_nowait(work)  # another server does it
                self._queue.task_done()
                if server.url in self._alive:
                    self._server_gone(server, exc)
                return
            finally:
                st.in_flight -= 1
            record = self._record(work, result, server.url)
            await self._write(record, result.ok)
            if result.ok:
                cut = result.cut["reason"] if result.cut else None
                st.record_ok(result.turns, result.completion_tokens, len(result.truncated), cut)
            else:
                st.record_failed(result.reason, result.completion_tokens)
            self._queue.task_done()

    def _server_gone(self, server: ChatServer, exc: ServerGone) -> None:
        self._alive.discard(server.url)
        with self.stats.lock:
            self.stats.servers[server.url]["state"] = "gone"
        log.error("%s; its conversations go to the other servers", exc)
        if not self._alive:
            self.fatal = exc
            self._all_gone.set()

    async def _watch_stop(self) -> None:
        while not self.stop.is_set():
            await asyncio.sleep(0.2)

    # -- the run ----------------------------------------------------------------------------------

    async def _main(self) -> None:
        cfg, st = self.cfg, self.stats
        servers = [ChatServer(url, Sampling(), cfg.retry, cfg.concurrency) for url in cfg.servers]
        for s in servers:
            await s.open()
        try:
            described = await asyncio.gather(*(s.describe() for s in servers), return_exceptions=True)
            for res in described:
                if isinstance(res, BaseException):
                    if not isinstance(res, HsextractError) or len(servers) == 1:
                        raise res
                    log.error("%s; the run goes on without it", res)
            servers = [s for s, res in zip(servers, described, strict=True) if not isinstance(res, BaseException)]
            if not servers:
                raise next(r for r in described if isinstance(r, BaseException))
            contexts = [s.context_len for s in servers if s.context_len]
            models = sorted({s.model for s in servers})
            if len(models) > 1:
                raise ConfigError(f"the servers serve different models ({', '.join(models)}); one run needs one model")
            model_dir = cfg.model
            if model_dir is None and Path(models[0]).is_dir():  # SGLang names the model by its path
                model_dir = Path(models[0])
            self.sampling = resolve(
                model_dir,
                min(contexts) if contexts else None,
                cfg.temperature,
                cfg.top_p,
                cfg.top_k,
                cfg.max_new_tokens,
            )
            for s in servers:
                s.sampling = self.sampling
                with st.lock:
                    st.servers[s.url] = {"state": "up", "model": s.model}
            self.store.check_settings(
                {
                    "model": models[0],
                    "sampling": self.sampling.to_json(),
                    "reasoning": cfg.reasoning,
                    "last_turn_only": cfg.last_turn_only,
                    "drop_truncated": cfg.drop_truncated,
                    "shard": str(cfg.shard),
                }
            )
            log.info(
                "regenerating %s -> %s on %d servers (%s), sampling %s, reasoning %s",
                cfg.dataset,
                self.store.data_path,
                len(servers),
                models[0],
                self.sampling.request_fields(),
                cfg.reasoning,
            )
            await self._run_workers(servers)
        finally:
            for s in servers:
                await s.close()

    async def _run_workers(self, servers: list[ChatServer]) -> None:
        self._queue: asyncio.Queue[_Work] = asyncio.Queue()
        self._slots = asyncio.Semaphore(len(servers) * self.cfg.concurrency)
        self._alive = {s.url for s in servers}
        self._all_gone = asyncio.Event()
        workers = [asyncio.create_task(self._worker(s)) for s in servers for _ in range(self.cfg.concurrency)]
        producer = asyncio.create_task(self._produce())

        async def finished() -> None:
            await producer
            await self._queue.join()

        ends = [
            asyncio.create_task(finished()),
            asyncio.create_task(self._watch_stop()),
            asyncio.create_task(self._all_gone.wait()),
        ]
        pending: set[asyncio.Task] = {*ends, *workers}
        try:
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    t.result()  # a bug in the producer or a worker surfaces here, never a hang
                if any(t in done for t in ends):
                    break  # all done, asked to stop, or every server gone (a worker ends when its server is)
        finally:
            for t in [*ends, producer, *workers]:
                t.cancel()
            await asyncio.gather(*ends, producer, *workers, return_exceptions=True)

    def summary(self) -> dict[str, Any]:
        """The whole regeneration, over every run that wrote to its output (counted from its files, so
        a resumed run's summary agrees with the errors file), and what this run did of it."""
        st = self.stats
        return {
            "state": st.state,
            "conversations_total": st.conversations_total,
            **self.store.totals.to_json(),
            "this_run": st.summary(),
            "output": str(self.store.data_path),
            "errors": str(self.store.errors_path),
            "sampling": self.sampling.to_json() if self.sampling else None,
            "finished_at": time.time(),
        }

    def run(self) -> RegenStats:
        cfg, st = self.cfg, self.stats
        self.store.open()
        out = self.store.output
        regen_summary_path(out).unlink(missing_ok=True)  # a new run is not finished yet
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsextract-regen-write")
        st.conversations_total = cfg.shard.size(count_rows(cfg.dataset))
        reporter = Reporter(st, regen_status_path(out), every=cfg.status_every_s, log_every=cfg.log_every_s)
        reporter.start()
        try:
            asyncio.run(self._main())
        except HsextractError as exc:
            self.fatal = exc
        except BaseException:
            self.stop.set()  # Ctrl-C or a bug: not done, so no summary
            st.state = "stopped"
            raise
        finally:
            self._writer.shutdown(wait=True)
            self.store.close()
            if self.fatal is not None:
                st.state, st.error = "failed", str(self.fatal)
            elif self.stop.is_set():
                st.state = "stopped"
            elif st.state == "running":
                st.state = "done"
            reporter.stop()
        if st.state == "done":
            atomic_write_json(regen_summary_path(out), self.summary())
        if self.fatal is not None:
            raise self.fatal
        return st
