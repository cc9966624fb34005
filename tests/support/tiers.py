"""The suite's tiers: what the fast tier (`make test-fast`) may not start.

The fast tier deselects the tests marked `server` and `sandbox`; a test that starts a SGLang
server or a systemd sandbox without its marker would still run there and take minutes. So the
starters call `refuse_in_fast_tier`, and such a test fails at once, saying which marker it lacks.
"""

from __future__ import annotations

import os

FAST_TIER_ENV = "HSEXTRACT_FAST_TIER"


class UnmarkedSlowTest(RuntimeError):
    """A test started a server or a sandbox without the marker that keeps it out of the fast tier."""


def refuse_in_fast_tier(what: str, marker: str) -> None:
    if os.environ.get(FAST_TIER_ENV):
        raise UnmarkedSlowTest(
            f"this test starts {what} but is not marked `{marker}`: add @pytest.mark.{marker} "
            f"(or use a fixture whose name ends in _server) so `make test-fast` leaves it out"
        )
