"""One staged dump and its client record in, one durable temporary sample file out: the drain's
per-sample work, as a plain function of its inputs.

`prepare` reads and checks the dump, has the format encode it, writes
``<output>/.hsextract/tmp/<rid>.tmp`` and fsyncs it, and counts the sample's draft-vocabulary
tokens when asked. It returns what became of the dump (`Ready`, `Invalid` or `NoSpace`) instead
of acting on it: it touches nothing but that temporary file, knows nothing of threads, queues or
the run's accounts, and its inputs and results are plain picklable values. So the same function
runs in the drain's own worker threads and in its worker processes
(hsextract.drain.worker_processes), and the caller (hsextract.drain.worker) reports the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hsextract.drain import validate as v
from hsextract.drain.committer import Prepared
from hsextract.drain.selfcheck import GreedySelfCheck
from hsextract.drain.staged_io import MappedStates, map_states
from hsextract.durable import is_no_space, write_payload_durably
from hsextract.errors import StagingError
from hsextract.formats.base import OutputFormat, Sample, SourceRange
from hsextract.formats.manifest import new_hasher
from hsextract.records import SampleRecord
from hsextract.staging import STATES_FILE, DoneMarker, read_done_marker
from hsextract.vocab.counts import masked_counts

__all__ = ["Invalid", "Job", "NoSpace", "Ready", "prepare"]


@dataclass(frozen=True)
class Job:
    """What turning one dump into one file needs, besides the format and the temporary directory."""

    dump: Path
    record: SampleRecord
    expected: v.Expected  # what every dump of the run must look like
    checksum_algorithm: str  # the manifest header's
    count_vocab: bool  # count the sample's loss-masked tokens (the draft vocabulary)


@dataclass
class Ready:
    """The sample's temporary file is durable; `marker` is its dump's (the header is written from the first)."""

    prepared: Prepared
    marker: DoneMarker
    counts: tuple | None  # the draft vocabulary's counts of the sample (None: not asked)


@dataclass(frozen=True)
class Invalid:
    """A dump that cannot become a sample: quarantine it with this reason."""

    reason: str
    detail: str


@dataclass(frozen=True)
class NoSpace:
    """The output volume was full: nothing was kept; wait for space and prepare the dump again."""

    error: OSError


Outcome = Ready | Invalid | NoSpace


def prepare(fmt: OutputFormat, tmp_dir: Path, job: Job, selfcheck: GreedySelfCheck | None = None) -> Outcome:
    """Validate the dump of `job`, write its sample durably to its temporary file, and say how it went.

    `selfcheck` is given for a sample chosen for the greedy self-check (it needs the model's head,
    loaded once in the drain's own process)."""
    streams = bool(getattr(fmt, "streams_staged", False))
    mapped = None
    try:
        marker = read_done_marker(job.dump)
        mapped = map_states(job.dump / STATES_FILE)
        v.validate(marker, mapped.states, job.record, job.expected, check_values=not streams)
        fingerprint = v.check_fingerprint(marker, mapped.states)
        greedy = selfcheck.verify(marker, mapped.states) if selfcheck is not None else ""
        ready = _write_temporary(fmt, Path(tmp_dir), job, marker, mapped, streams)
    except StagingError as exc:
        return Invalid(v.UNREADABLE, str(exc))
    except v.InvalidDump as exc:  # from the checks, or met while streaming the rows
        return Invalid(exc.reason, exc.detail)
    except OSError as exc:
        if is_no_space(exc):
            return NoSpace(exc)
        raise
    finally:
        if mapped is not None:
            mapped.close()
    ready.prepared.fingerprint, ready.prepared.greedy_check = fingerprint, greedy
    return ready


def _write_temporary(fmt: OutputFormat, tmp_dir: Path, job: Job, marker: DoneMarker, mapped: MappedStates,
                     streams: bool) -> Ready:
    """Encode a validated dump into its durable temporary file; the committer gives it its name."""
    record, states = job.record, mapped.states
    staged = SourceRange(mapped.fd, mapped.data_start, mapped.data_len, mapped.view)
    if streams:
        h = states.hidden
        staged.check = v.finite_checker(h.dtype, h.shape[1] * h.shape[2] * h.element_size())
        staged.check_len = mapped.hidden_len
    sample = Sample(
        rid=record.rid,
        dataset_index=record.index,
        input_ids=states.input_ids,
        loss_mask=_as_int64(record.loss_mask),
        hidden=states.hidden,
        staged=staged,
    )
    tmp = tmp_dir / f"{record.rid}.tmp"
    hasher = new_hasher(job.checksum_algorithm)
    nbytes = write_payload_durably(tmp, fmt.encode(sample), hasher)
    checksum = f"{job.checksum_algorithm}:{hasher.hexdigest()}"
    # Counted from the very tensors written.
    counts = masked_counts(sample.input_ids, sample.loss_mask) if job.count_vocab else None
    prepared = Prepared(record.rid, record.index, len(record.input_ids), tmp, nbytes, checksum, job.dump)
    return Ready(prepared, marker, counts)


def _as_int64(values: list[int]):  # -> torch.Tensor
    import torch

    return torch.tensor(values, dtype=torch.int64)
