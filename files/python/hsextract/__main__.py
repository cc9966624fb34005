"""`python -m hsextract` runs the CLI (the systemd units call it through the venv's interpreter)."""

import sys

from hsextract.cli import main

sys.exit(main())
