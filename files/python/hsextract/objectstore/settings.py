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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hsextract.errors import ConfigError
from hsextract.objectstore.retries import BACKOFF_FIRST_S, BACKOFF_MAX_S, DEFAULT_ATTEMPTS
from hsextract.options import Option, add_options, option, options_from

DEFAULT_READ_TIMEOUT_S = 120.0

CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


STORE = "object store (an --output of s3://bucket/prefix)"  # the flags' group in --help


@dataclass(frozen=True)
class StoreSettings:
    """The endpoint and region (not secret) and where the credentials come from: the object-store
    flags of every command that may take ``--output s3://...``, declared once (hsextract.options)."""

    endpoint: str = option(  # "" = boto3's (AWS, or AWS_ENDPOINT_URL)
        "",
        flag="--s3-endpoint",
        group=STORE,
        metavar="URL",
        parser_default=None,
        help="the S3 server (default: boto3's: AWS, or AWS_ENDPOINT_URL)",
    )
    region: str = option(
        "", flag="--s3-region", group=STORE, metavar="NAME", parser_default=None, help="the region (default: boto3's)"
    )
    credentials_file: str = option(  # "" = boto3's own chain
        "",
        flag="--s3-credentials",
        group=STORE,
        metavar="FILE",
        parser_default=None,
        help="an INI file like ~/.aws/credentials, mode 0600 (default: boto3's credential chain)",
    )
    # How long an answer is waited for, and how many times a request the server fails is tried
    # (hsextract.objectstore.retries; an unreachable server is waited for without a bound).
    read_timeout_s: float = option(
        DEFAULT_READ_TIMEOUT_S,
        flag="--s3-timeout",
        group=STORE,
        metavar="SECONDS",
        type=float,
        help=f"how long an answer is waited for before the request is tried again (default {DEFAULT_READ_TIMEOUT_S:g})",
    )
    attempts: int = option(
        DEFAULT_ATTEMPTS,
        flag="--s3-attempts",
        group=STORE,
        metavar="N",
        type=int,
        help="how many times a request the server fails (a 5xx, a reset, an answer cut short or late) is tried "
        f"before the command stops saying so (default {DEFAULT_ATTEMPTS}; an unreachable server is waited for)",
    )
    first_wait_s: float = option(
        BACKOFF_FIRST_S,
        flag="--s3-first-wait",
        group=STORE,
        metavar="SECONDS",
        type=float,
        help=f"the wait before a failed request is tried again the first time; it doubles at each try, to at "
        f"most {BACKOFF_MAX_S:g} s (default {BACKOFF_FIRST_S:g}; a store on the same host may be asked sooner)",
    )
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
    first_wait_s: float = BACKOFF_FIRST_S,
) -> StoreSettings:
    """Settings from their values; the credentials file read and checked now, before anything is sent."""
    return checked(
        StoreSettings(
            endpoint, region, str(credentials_file or ""), float(read_timeout_s), int(attempts), float(first_wait_s)
        )
    )


def checked(settings: StoreSettings) -> StoreSettings:
    """`settings` once checked, with the secrets of its credentials file (and the endpoint and region
    the file names, where the settings name none); ConfigError naming the flag at fault."""
    if not settings.read_timeout_s > 0:
        raise ConfigError(f"--s3-timeout {settings.read_timeout_s}: give the seconds an answer is waited for, above 0")
    if settings.attempts < 1:
        raise ConfigError(f"--s3-attempts {settings.attempts}: give at least 1")
    if not 0 < settings.first_wait_s <= BACKOFF_MAX_S:
        raise ConfigError(f"--s3-first-wait {settings.first_wait_s}: give seconds above 0, at most {BACKOFF_MAX_S:g}")
    endpoint, region, secrets = settings.endpoint, settings.region, {}
    if settings.credentials_file:
        values = read_credentials_file(settings.credentials_file)
        secrets = {k: values[k] for k in CREDENTIAL_KEYS if values.get(k)}
        endpoint = endpoint or values.get("endpoint_url", "")
        region = region or values.get("region", "")
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"--s3-endpoint {endpoint!r}: give the server's URL, e.g. http://127.0.0.1:8333")
    return replace(settings, endpoint=endpoint, region=region, _secrets=secrets)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """The object-store flags, for every command that may take ``--output s3://...``."""
    groups = add_options(parser, StoreSettings)
    add_work_dir_argument(groups[STORE])


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
    """The object-store settings from a command's parsed flags, or from its settings (a flag it lacks
    is the setting's default), checked."""
    return checked(options_from(StoreSettings, args))
