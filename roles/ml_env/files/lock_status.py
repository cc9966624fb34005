"""Compare a venv with a pinned lock: print the lines of the lock the venv does not satisfy.

Run with the venv's own interpreter. Exact pins (name==version) are compared with the installed
distributions' metadata, so a venv that already holds the lock is left alone (no pip run at all).
Output: JSON {"unsatisfied": ["name==version (installed: x)", ...]}.
"""

import json
import re
import sys
from importlib import metadata


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def main(lock_path):
    installed = {canonical(d.metadata["Name"] or ""): d.version for d in metadata.distributions()}
    unsatisfied = []
    with open(lock_path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            m = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;]+)", line)
            if not m:
                unsatisfied.append(f"{line} (not an exact pin)")
                continue
            have = installed.get(canonical(m.group(1)))
            if have != m.group(2):
                unsatisfied.append(f"{line} (installed: {have})")
    print(json.dumps({"unsatisfied": unsatisfied}))


if __name__ == "__main__":
    main(sys.argv[1])
