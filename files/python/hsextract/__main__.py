"""`python -m hsextract` runs the CLI (the systemd units call it through the venv's interpreter)."""

from hsextract.cli import entry

entry()
