"""A stdout callback that prints one JSON document per run: plays, tasks, per-host results, stats.

ansible-core ships no JSON stdout callback (``ansible.posix.json`` lives in a collection the
controller venv does not install), and the tests need structured results: which tasks changed,
which failed and with what message. The shape follows ``ansible.posix.json``.
"""

from __future__ import annotations

import json
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: hsx_json
type: stdout
short_description: one JSON document with every task result (for hsextract's tests)
description: Prints plays, tasks, per-host results and stats as one JSON document at the end.
"""


def _plain(value):
    """Ansible's tagged/unsafe wrappers as plain JSON values."""
    return json.loads(json.dumps(value, default=str))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "hsx_json"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plays = []

    def v2_playbook_on_play_start(self, play):
        self.plays.append({"play": {"name": play.get_name()}, "tasks": []})

    def v2_playbook_on_task_start(self, task, is_conditional):
        self.plays[-1]["tasks"].append({"task": {"name": task.get_name(), "started": time.monotonic()}, "hosts": {}})

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def _record(self, result, **flags):
        data = dict(result._result)
        data.update(flags)
        task = self.plays[-1]["tasks"][-1]
        task["hosts"][result._host.get_name()] = _plain(data)
        # Seconds from the task's start to its last host result: where a slow play spends its time.
        task["task"]["duration_s"] = round(time.monotonic() - task["task"]["started"], 3)

    def v2_runner_on_ok(self, result, **kwargs):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False, **kwargs):
        self._record(result, failed=True, ignored=bool(ignore_errors))

    def v2_runner_on_skipped(self, result, **kwargs):
        self._record(result, skipped=True)

    def v2_runner_on_unreachable(self, result, **kwargs):
        self._record(result, unreachable=True, failed=True)

    def v2_playbook_on_stats(self, stats):
        hosts = sorted(stats.processed.keys())
        summary = {h: stats.summarize(h) for h in hosts}
        self._display.display(json.dumps({"plays": self.plays, "stats": summary}, default=str))
