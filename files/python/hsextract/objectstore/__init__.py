"""An S3-compatible object store as the training set's home: ``--output s3://bucket/prefix``.

The drain, ``status``, ``finalize --verify``, ``pull`` and ``collect`` write to and read from a
bucket through this package and nothing else. The rest of hsextract sees a local *work
directory* (the drain's temporary files, its status, the client's files, a copy of the
manifest): everything of an output directory except the samples and the dataset-level files,
which live in the bucket.

The pieces: `url` (``s3://bucket/prefix``), `settings` (endpoint, region, credentials; never
logged), `store` (one S3 client with backoff and clear errors: `store_errors`; its uploads in
parts: `multipart`; a download's local side: `local_files`), `check` (the server is S3, the
credentials and bucket work, and it honours conditional writes: the canary), `segments` (the
manifest as immutable numbered segments), `committer` (a bucket's committer, hsextract.output's
commit seam), `drain_side` (the bucket as the drain's target, hsextract.output.target), `output`
(a drain's start on a bucket), `tokens` (a sample's token ids read back from the bucket), `mirror`
(the dataset-level files published), `verify`, `pull`, `collect` (with `collect_copy`).
"""
