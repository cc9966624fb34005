"""How to reach an object store: endpoint, region and credentials, never written anywhere.

boto3's own chain is used as it is (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws``, an
instance role), unless ``--s3-credentials FILE`` names a credentials file. That file is INI, as
AWS's own::

    [default]
    aws_access_key_id = ...
    aws_secret_access_key = ...
    # optional: aws_session_token, region, endpoint_url

and must be readable by its owner only (mode 0600 or stricter): a secret others can read is
refused, as ssh refuses a private key. The secrets are held in memory only; `StoreSettings`
prints without them, and nothing of hsextract writes them to a log, a status file or a command
line (the systemd units pass the file's path).
"""

from __future__ import annotations

import argparse
import configparser
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError
from hsextract.objectstore.retries import DEFAULT_ATTEMPTS
from hsextract.options import Option

DEFAULT_READ_TIMEOUT_S = 120.0

CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


@dataclass(frozen=True)
class StoreSettings:
    """The endpoint and region (not secret) and where the credentials come from."""

    endpoint: str = ""  # "" = boto3's (AWS, or AWS_ENDPOINT_URL)
    region: str = ""
    credentials_file: str = ""  # "" = boto3's own chain
    # How long an answer is waited for, and how many times a request the server fails is tried
    # (hsextract.objectstore.retries; an unreachable server is waited for without a bound).
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    attempts: int = DEFAULT_ATTEMPTS
    # Read from credentials_file; kept out of repr, so a logged or raised settings object shows no secret.
    _secrets: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        """What a log line may say about them."""
        parts = [f"endpoint {self.endpoint or 'from the environment'}"]
        if self.region:
            parts.append(f"region {self.region}")
        parts.append(f"credentials {'from ' + self.credentials_file if self.credentials_file else 'from boto3'}")
        return ", ".join(parts)

    def client_kwargs(self) -> dict[str, Any]:
        """What boto3.client needs beyond the service name (secrets included: never log it)."""
        kw: dict[str, Any] = {}
        if self.endpoint:
            kw["endpoint_url"] = self.endpoint
        if self.region:
            kw["region_name"] = self.region
        kw.update(self._secrets)
        return kw


def read_credentials_file(path: str | Path) -> dict[str, str]:
    """The keys of a credentials file's ``[default]`` section (or its only one), after checking its
    mode; ConfigError saying what is wrong (never what the secret is)."""
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(f"--s3-credentials {p}: no such file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"--s3-credentials {p}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"--s3-credentials {p}: readable by others (mode {stat.S_IMODE(st.st_mode):04o}); a "
            f"credentials file must be its owner's alone: chmod 600 {p}"
        )
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(p.read_text())
    except (configparser.Error, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"--s3-credentials {p}: not an INI file like ~/.aws/credentials ({type(exc).__name__})"
        ) from None
    sections = parser.sections()
    name = "default" if "default" in sections else (sections[0] if len(sections) == 1 else "")
    if not name:
        raise ConfigError(f"--s3-credentials {p}: give one section, or a [default] one")
    values = {k: v.strip() for k, v in parser[name].items()}
    missing = [k for k in CREDENTIAL_KEYS[:2] if not values.get(k)]
    if missing:
        raise ConfigError(f"--s3-credentials {p}: section [{name}] lacks {', '.join(missing)}")
    return values


def settings_from(
    endpoint: str = "",
    region: str = "",
    credentials_file: str = "",
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
    attempts: int = DEFAULT_ATTEMPTS,
) -> StoreSettings:
    """Settings from the flags; the credentials file read and checked now, before anything is sent."""
    if not read_timeout_s > 0:
        raise ConfigError(f"--s3-timeout {read_timeout_s}: give the seconds an answer is waited for, above 0")
    if attempts < 1:
        raise ConfigError(f"--s3-attempts {attempts}: give at least 1")
    secrets: dict[str, str] = {}
    if credentials_file:
        values = read_credentials_file(credentials_file)
        secrets = {k: values[k] for k in CREDENTIAL_KEYS if values.get(k)}
        endpoint = endpoint or values.get("endpoint_url", "")
        region = region or values.get("region", "")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"--s3-endpoint {endpoint!r}: give the server's URL, e.g. http://127.0.0.1:8333")
    return StoreSettings(endpoint, region, str(credentials_file or ""), float(read_timeout_s), int(attempts), secrets)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The object-store flags, for every command that may take ``--output s3://...``."""
    g = parser.add_argument_group("object store (an --output of s3://bucket/prefix)")
    g.add_argument("--s3-endpoint", metavar="URL", help="the S3 server (default: boto3's: AWS, or AWS_ENDPOINT_URL)")
    g.add_argument("--s3-region", metavar="NAME", help="the region (default: boto3's)")
    g.add_argument(
        "--s3-credentials",
        metavar="FILE",
        help="an INI file like ~/.aws/credentials, mode 0600 (default: boto3's credential chain)",
    )
    g.add_argument(
        "--s3-timeout",
        metavar="SECONDS",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        help=f"how long an answer is waited for before the request is tried again (default {DEFAULT_READ_TIMEOUT_S:g})",
    )
    g.add_argument(
        "--s3-attempts",
        metavar="N",
        type=int,
        default=DEFAULT_ATTEMPTS,
        help="how many times a request the server fails (a 5xx, a reset, an answer cut short or late) is tried "
        f"before the command stops saying so (default {DEFAULT_ATTEMPTS}; an unreachable server is waited for)",
    )
    add_work_dir_argument(g)


# ``--work-dir``: where a bucket output's local bookkeeping lives, a flag of every command that
# takes --output (its settings' field: ``option(None, like=WORK_DIR_OPTION)``).
WORK_DIR_OPTION = Option(
    metavar="DIR",
    help="with --output s3://...: the local directory of the run's bookkeeping (status, "
    "the client's files, the drain's temporary files; default "
    "/var/lib/hsextract/objectstore/<bucket>/<prefix>)",
)


def add_work_dir_argument(parser: Any) -> None:
    """``--work-dir`` for a command whose flags are not a settings class."""
    parser.add_argument("--work-dir", metavar=WORK_DIR_OPTION.metavar, help=WORK_DIR_OPTION.help)


def settings_from_args(args: object) -> StoreSettings:
    return settings_from(
        getattr(args, "s3_endpoint", None) or "",
        getattr(args, "s3_region", None) or "",
        getattr(args, "s3_credentials", None) or "",
        _given(getattr(args, "s3_timeout", None), DEFAULT_READ_TIMEOUT_S),
        int(_given(getattr(args, "s3_attempts", None), DEFAULT_ATTEMPTS)),
    )


def _given(value: Any, default: float) -> float:
    return default if value is None else float(value)
