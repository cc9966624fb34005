"""`python -m hsextract` runs the CLI (the systemd units call it through the venv's interpreter)."""

import sys

from hsextract import shutdown

shutdown.install_early(sys.argv[1:])  # before the imports below: a stop during them is a clean stop

from hsextract.cli import entry  # noqa: E402

entry()
