"""A fleet: the hosts of one inventory group, each extracting its own shard of one dataset.

Each host plans, extracts and reports by itself (``hsextract plan``, ``extract``, ``drain``,
``status``); this package judges their reports as one run, on the Ansible controller, where no
host's ml-env is needed (it is pure Python): `plan` before anything starts (every host can hold
its shard, the hosts read one dataset, the shards cover it exactly once) and `status` while it
runs (one table, the totals and the fleet's reconciliation). ``hsextract collect`` brings the
hosts' sets into one afterwards.
"""
