"""Why a collect could not take a host's sample: the reasons of ``.hsextract/collect-failures.jsonl``
(hsextract.output.layout.collect_failures_path), one vocabulary for a directory's collect
(hsextract.collect) and a bucket's (hsextract.objectstore.collect)."""

from __future__ import annotations

# What a file's problem (hsextract.output.manifest.file_problem) is called in the failures.
REASONS = {"missing": "collect_missing", "size": "collect_size", "checksum": "collect_checksum"}
UNREADABLE = "collect_unreadable"
UNSAFE = "collect_unsafe_path"  # the row names no regular file inside its host output: nothing was read
WRONG_SAMPLE = "collect_wrong_sample"  # the file is not the row's sample (hsextract.formats.sample_check)
SAME_BYTES = "collect_same_bytes"  # the row's file has another row's bytes (hsextract.output.same_bytes)
