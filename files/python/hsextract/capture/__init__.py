"""Server-side capture of EAGLE-3 hidden states inside SGLang's forward pass.

* `core`: which rows to keep, where they go, when a request is complete (pure logic);
* `writer`: device -> pinned host buffers -> parallel pwrite into /dev/shm (never blocks on I/O),
  with `slices` (a batch's writer tasks), `states_file` (a dump's files) and `outcomes` (done,
  failed, the counters);
* `writer_process`: the same writer in a child process, for a scheduler bound by its own GIL
  (`writer_child`: the child itself; `shared_buffers`, `wire`: what the two share);
* `sglang_hook`: the adapter to SGLang 0.5.23's model objects (checks, layers, hooks);
* `patch`: renders the external-model package that wires the hook into SGLang;
* `selfcheck`: verifies a staged dump against the model (used by the smoke test).
"""
