"""Where the training set lives, as the drain sees it: one target, a directory or a bucket.

The drain (hsextract.drain.core) holds one `OutputTarget` and never asks which kind it is. A target

* is taken over as the last step of the drain's start (a bucket's fences its earlier writers);
* gives the drain its committer (hsextract.output.committer): prepared samples become the set's,
  in output-index order, and only then are their staged dumps deleted;
* says whether a prepared sample's temporary file must be durable: in a directory it becomes the
  set's file by a rename, in a bucket it is only uploaded;
* reads a sample's token ids back for the dataset-level files and the draft vocabulary where its
  file is not in the work directory (`tokens`; None: from the files there);
* publishes the dataset-level files once the drain has written them into the work directory;
* shows its state in the drain's status (`status`; nothing for a directory).

`DirectoryTarget` is the plain directory; hsextract.objectstore.drain_side.BucketTarget the
bucket, and hsextract.objectstore.drain_side.open_target picks one from the drain's settings. A
target that does not answer now raises `TargetUnreachable`, and what waits for it is tried again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hsextract.errors import HsextractError
from hsextract.output.committer import CommitEvents, Committer
from hsextract.output.manifest import ManifestEntry

if TYPE_CHECKING:
    import torch

# A sample's (input_ids, loss_mask) from its manifest entry, where its file is not beside the
# dataset-level files (a set in a bucket: hsextract.objectstore.tokens.RemoteTokens).
TokenReader = Callable[[ManifestEntry], "tuple[torch.Tensor, torch.Tensor]"]


class TargetUnreachable(HsextractError):
    """The set's home does not answer now (a bucket's server); what waits for it is tried again later."""


class OutputTarget(Protocol):
    """Where the set lives (see the module's docstring)."""

    where: str  # how a person names it in a message: "the output directory", "the bucket"
    durable_tmp: bool  # the prepared samples' temporary files are fsynced

    @property
    def tokens(self) -> TokenReader | None:
        """How a sample's tokens are read back where its file is not in the work directory."""
        ...

    def committer(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        tmp_dir: Path,
        dump_dir: Path,
        entries: list[ManifestEntry],
        events: CommitEvents,
    ) -> Committer:
        """The committer of the drain's samples, starting from the manifest's `entries`."""
        ...

    def take_over(self) -> None:
        """The last step of the drain's start, once every check that can refuse it passed: a
        bucket's fences the prefix's earlier writers."""
        ...

    def publish_dataset_files(self, work: Path) -> None:
        """Publish the dataset-level files the drain wrote into `work`; TargetUnreachable to come back later."""
        ...

    def status(self) -> dict[str, Any]:
        """What the drain's status shows of it (``drain-status.json``'s ``objectstore``)."""
        ...

    def last_word(self) -> str | None:
        """What the drain's last lines say of it (a bucket: its retries, by request and cause)."""
        ...


class DirectoryTarget:
    """The set in the output directory itself: the drain's samples are renamed into place."""

    where = "the output directory"
    durable_tmp = True
    tokens: TokenReader | None = None

    def committer(
        self,
        out: Path,
        relative_path: Callable[[int], str],
        tmp_dir: Path,
        dump_dir: Path,
        entries: list[ManifestEntry],
        events: CommitEvents,
    ) -> Committer:
        return Committer(out, relative_path, tmp_dir, dump_dir, entries, events)

    def take_over(self) -> None:
        """The drain's lock on the directory (hsextract.output.lock) is the only fence it needs."""

    def publish_dataset_files(self, work: Path) -> None:
        """They are written in place."""

    def status(self) -> dict[str, Any]:
        return {}

    def last_word(self) -> str | None:
        """A directory has nothing to add."""
        return None
