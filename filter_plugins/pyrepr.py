"""The ``pyrepr`` filter: a value as a Python literal, for templates that render Python source.

The capture patch templates (templates/capture_patch) write their configuration as a Python dict
literal; ``hsextract capture-patch`` renders them with ``repr``, and this filter gives Ansible's
``template`` module the same result. Values go through JSON first, so Ansible's string and
mapping wrappers become plain ``str``/``dict`` and the output is a literal Python can read back.
"""

from __future__ import annotations

import json


def pyrepr(value):
    return repr(json.loads(json.dumps(value)))


class FilterModule:
    def filters(self):
        return {"pyrepr": pyrepr}
