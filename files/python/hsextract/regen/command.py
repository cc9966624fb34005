"""``hsextract regenerate``: the served model writes the replies of a dataset, which extract then reads.

Every flag can also come from the shared run configuration (``--config FILE``, keys = flag names
with underscores), as for ``hsextract extract``.
"""

from __future__ import annotations

import argparse
import json
import sys

from hsextract import shutdown
from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError
from hsextract.options import add_options, missing_options, options_from
from hsextract.regen.config import RegenConfig
from hsextract.regen.progress import progress_line
from hsextract.regen.runner import RegenerateRun


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, RegenConfig)
    add_config_argument(parser)


def config_from_args(args: argparse.Namespace) -> RegenConfig:
    missing = missing_options(RegenConfig, args)
    if missing:
        raise ConfigError(f"hsextract regenerate needs {', '.join(missing)} (as flags or keys of --config)")
    return options_from(RegenConfig, args)


def run(args: argparse.Namespace) -> int:
    run_ = RegenerateRun(config_from_args(args), shutdown.requested())
    try:
        stats = run_.run()
    except KeyboardInterrupt:
        run_.stop.set()
        raise
    print(progress_line(stats.snapshot()), file=sys.stderr)
    print(json.dumps(run_.summary(), sort_keys=True))
    return 0
