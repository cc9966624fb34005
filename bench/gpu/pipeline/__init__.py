"""The GPU tier's end-to-end bench of the product (``python3 bench/gpu/pipeline_gpu.py``, whose
docstring says what it runs), one job a module:

- ``settings``: paths, port, format and the throughput rounds' sides, held fixed;
- ``case``: `Case`, one run of the product described as a frozen value;
- ``dataset``: the generated conversations and their ids as the client encodes them;
- ``loop``: the plain asyncio loop the product is measured against;
- ``processes``: `hsextract extract` and `hsextract drain` started as the units run them;
- ``sampling``: the timeline and the output reaper, threads beside a run;
- ``verdict``: whether a run passed, from its manifest, accounts and quarantine;
- ``rows``: the rows compared, run against run and against transformers;
- ``machine``: the disk's speed and ceiling, a sample's bytes per token, the tokenizer's phase;
- ``servers``: each model's plan and its capture and plain servers;
- ``correctness`` and ``throughput``: one model's runs of each kind;
- ``result``: the JSON result, a bound's rounds summed up, the line printed after each run;
- ``orchestrate``: the whole run over the models; ``cli``: the arguments, the log and ``main``.

The modules import the tier's scripts beside them (`gpu_env`, `gpu_server`, `capture_server_gpu`)
and bench/common.py by their plain names: pipeline_gpu.py puts their directories on sys.path.
"""
