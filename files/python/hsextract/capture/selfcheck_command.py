"""``hsextract selfcheck``: check one staged dump against the model; JSON on stdout, exit 0 pass / 1 fail."""

from __future__ import annotations

import argparse
import json

from hsextract.capture.selfcheck import check_dump
from hsextract.config_file import add_config_argument
from hsextract.errors import ConfigError


def _ids(text: str | list[int] | None) -> list[int] | None:
    if text is None or isinstance(text, list):
        return text
    text = text.strip()
    try:
        return [int(x) for x in (json.loads(text) if text.startswith("[") else text.split(",")) if str(x).strip()]
    except ValueError:
        raise ConfigError(f"--input-ids {text!r}: expected comma-separated integers or a JSON list") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--dump-dir", help="staging directory holding <rid>/")
    parser.add_argument("--rid", required=True, help="request id of the probe")
    parser.add_argument("--model", "--model-path", dest="model", help="model directory (config.json + safetensors)")
    parser.add_argument("--input-ids", help="the probe's token ids (1,2,3 or [1,2,3])")
    parser.add_argument("--server-token", type=int, help="the token the server returned at temperature 0")
    parser.add_argument(
        "--server",
        metavar="URL",
        help="the server's URL: its own logprobs of the probe's prompt must match those the dump's "
        "final hidden states give (the logprob check; default: the greedy check alone)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.dump_dir or not args.model:
        raise ConfigError("selfcheck needs --dump-dir and --model (or a --config file with them)")
    result = check_dump(
        args.dump_dir, args.rid, args.model, _ids(args.input_ids), args.server_token, args.server or None
    )
    print(result.to_json())
    return 0 if result.ok else 1
