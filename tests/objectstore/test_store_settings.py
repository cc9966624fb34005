"""How a command reaches a bucket, from its object-store flags and a run configuration file: the
flags are declared once, as the fields of `StoreSettings` (hsextract.options), and each command line
below gives, field by field, the settings the commands built when every flag was spelled three times
(a flag, a field, the line between them). Nothing is sent: the settings are only read and checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hsextract.config_file import apply_config
from hsextract.errors import ConfigError
from hsextract.objectstore.pull import add_arguments
from hsextract.objectstore.settings import StoreSettings, settings_from_args
from hsextract.plan.settings import PlanSettings


def _settings(*flags: str) -> StoreSettings:
    """The settings ``hsextract pull s3://sets/run DIR`` reaches the bucket with."""
    parser = argparse.ArgumentParser(prog="hsextract pull")
    add_arguments(parser)
    argv = ["s3://sets/run", "/pulled", *flags]
    return settings_from_args(apply_config(parser, parser.parse_args(argv), argv))


@pytest.fixture
def credentials(tmp_path) -> Path:
    path = tmp_path / "s3.credentials"
    path.write_text(
        "[default]\naws_access_key_id = AKID\naws_secret_access_key = s3cr3t\n"
        "endpoint_url = http://10.0.0.1:8333\nregion = eu-1\n"
    )
    path.chmod(0o600)
    return path


def test_without_store_flags_boto3s_chain_is_used_with_the_default_bounds():
    assert _settings() == StoreSettings(endpoint="", region="", credentials_file="", read_timeout_s=120.0, attempts=10)
    assert _settings().client_kwargs() == {}


def test_every_store_flag_is_the_setting_it_names():
    flags = ["--s3-endpoint", "http://x:1", "--s3-region", "r", "--s3-timeout", "5", "--s3-attempts", "3"]
    assert _settings(*flags, "--s3-first-wait", "0.05") == StoreSettings(
        endpoint="http://x:1", region="r", credentials_file="", read_timeout_s=5.0, attempts=3, first_wait_s=0.05
    )


def test_a_credentials_file_gives_the_secrets_and_what_the_flags_leave_out(credentials):
    settings = _settings("--s3-credentials", str(credentials), "--s3-region", "mine")
    assert settings == StoreSettings(endpoint="http://10.0.0.1:8333", region="mine", credentials_file=str(credentials))
    assert settings.client_kwargs() == {
        "endpoint_url": "http://10.0.0.1:8333",
        "region_name": "mine",
        "aws_access_key_id": "AKID",
        "aws_secret_access_key": "s3cr3t",
    }
    assert "s3cr3t" not in repr(settings)


def test_the_run_configurations_keys_are_the_flags_and_a_flag_given_wins(tmp_path, credentials):
    run = {"s3_endpoint": "http://c:9", "s3_timeout": 7, "s3_attempts": 2, "s3_credentials": str(credentials)}
    (tmp_path / "run.json").write_text(json.dumps({**run, "s3_region": "from-the-file", "work_dir": "/w"}))
    assert _settings("--config", str(tmp_path / "run.json"), "--s3-region", "cli") == StoreSettings(
        endpoint="http://c:9", region="cli", credentials_file=str(credentials), read_timeout_s=7.0, attempts=2
    )


def test_a_commands_settings_without_store_flags_reach_the_bucket_with_the_defaults():
    plan = PlanSettings(dataset="d.jsonl", model="m", output="s3://sets/run", work_dir="/w")
    assert settings_from_args(plan) == StoreSettings()


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (["--s3-timeout", "0"], "--s3-timeout 0.0: give the seconds an answer is waited for, above 0"),
        (["--s3-attempts", "0"], "--s3-attempts 0: give at least 1"),
        (["--s3-first-wait", "0"], "--s3-first-wait 0.0: give seconds above 0, at most 20"),
        (["--s3-first-wait", "30"], "--s3-first-wait 30.0: give seconds above 0, at most 20"),
        (["--s3-endpoint", "ftp://x"], "--s3-endpoint 'ftp://x': give the server's URL"),
        (["--s3-credentials", "/no/such/file"], "--s3-credentials /no/such/file: no such file"),
    ],
)
def test_a_setting_that_cannot_be_used_is_refused_naming_its_flag(flags, refusal):
    with pytest.raises(ConfigError) as refused:
        _settings(*flags)
    assert str(refused.value).startswith(refusal)
