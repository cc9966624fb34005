"""Filters that check the run's settings with hsextract's own code, on the controller.

The play must refuse a bad setting in seconds, before it builds the environment or loads a model,
and refuse exactly what hsextract itself would refuse hours later. So the checks are not written
again in Jinja: each filter calls the function the client, the drain or the capture calls
(`hsextract.staging.records.check_prefix`, `hsextract.shard.Shard.parse`, `hsextract.layers.resolve`) and
returns the problem as one line that names the Ansible variable, or "" when there is none; the
role asserts that the problems are empty. The paths of the files a run keeps in an output
directory come from `hsextract.output.layout`, their one owner.

The modules imported here use only the standard library (the controller's Python has neither
torch nor SGLang; tests/ansible/test_settings_filters.py holds them to that). They are imported
from the repository's files/python, the tree that the ml_env role installs on the host.
"""

from __future__ import annotations

import inspect
import json
import posixpath
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

_SOURCE = Path(__file__).resolve().parents[3] / "files" / "python"
if str(_SOURCE) not in sys.path:
    sys.path.insert(0, str(_SOURCE))

from hsextract import formats, layers, model_info, shard  # noqa: E402
from hsextract.errors import ConfigError  # noqa: E402
from hsextract.objectstore import settings as store_settings  # noqa: E402
from hsextract.objectstore import url as store_url  # noqa: E402
from hsextract.output import layout  # noqa: E402
from hsextract.staging import records  # noqa: E402

_Shard = shard.Shard  # for `layout_path`, whose parameter `shard` hides the module


def rid_prefix_problem(prefix: str) -> str:
    """What is wrong with ``hsextract_rid_prefix`` for the client and the capture ("" if nothing)."""
    try:
        records.check_prefix(str(prefix))
    except ConfigError as exc:
        return f"hsextract_rid_prefix: {exc}."
    return ""


def precision_problem(precision: str, fmt: str) -> str:
    """hsextract_precision against hsextract_format: the refusal of the drain, the client and the plan
    (`hsextract.formats.check_precision`), or ""."""
    try:
        formats.check_precision(fmt, precision)
    except ConfigError as exc:
        return f"hsextract_precision={precision}: {exc}; set hsextract_precision: bf16 or a format that reads it."
    return ""


def shard_problem(text: str) -> str:
    """What is wrong with ``hsextract_shard`` ("" if nothing; "" itself is the whole dataset).

    The setting is also written unquoted into the regeneration unit's command line, so it must be
    spelled as the parser's canonical ``i/n`` (no spaces, signs or leading zeros).
    """
    text = str(text)
    if text == "":
        return ""
    try:
        parsed = shard.Shard.parse(text)
    except ConfigError as exc:
        return f"hsextract_shard: {exc}; '' sends the whole dataset."
    if text != str(parsed):
        return f"hsextract_shard: shard {text!r}: write it as '{parsed}'."
    return ""


def client_processes_problem(value: object) -> str:
    """What is wrong with ``hsextract_client_processes`` ("" if nothing): "auto", or a number of
    client processes >= 1, as ``hsextract extract --process j/P`` takes it."""
    if str(value) == "auto":
        return ""
    try:
        if isinstance(value, bool) or str(value).strip() != str(int(str(value))):
            raise ValueError(value)
        shard.check_process(0, int(str(value)))
    except (ValueError, ConfigError) as exc:
        why = f" ({exc})" if isinstance(exc, ConfigError) else ""
        return f"hsextract_client_processes: expected auto or a number of client processes >= 1, got {value!r}{why}."
    return ""


def process_shards(host_shard: str, processes: int | str) -> list[str]:
    """The sub-shards of the host's client processes, process j's at index j, as ``i/n``
    (hsextract.shard.Shard.sub_shard): the names of their files in the output (their summaries)."""
    host = shard.Shard.parse(str(host_shard or shard.WHOLE))
    count = int(processes)
    return [str(host.sub_shard((j, count))) for j in range(count)]


def summary_path(of_shard: str, output_dir: str) -> str:
    """The summary of the client of shard `of_shard` (``i/n``) in `output_dir`, as hsextract.output.layout names it."""
    return layout_path(output_dir, "client_summary", shard=of_shard)


def aux_layer_problem(
    ids: str | Sequence[int] | None,
    convention: str,
    model_config: Mapping[str, Any] | None = None,
    model_path: str = "",
) -> str:
    """What is wrong with ``hsextract_aux_layer_ids`` ("" if nothing), checked as the capture does.

    Without `model_config` (the model's parsed config.json) only the order and the lower bound are
    known, and [] (the EAGLE-3 default, which depends on the depth) passes; with it, the ids, or
    the default for [], are checked against the model's depth.
    """
    shown = f"hsextract_aux_layer_ids={ids!r}" if isinstance(ids, str) else f"hsextract_aux_layer_ids={list(ids or [])}"
    try:
        parsed = layers.parse_ids(ids if isinstance(ids, str) else list(ids or [])) or None
    except ConfigError as exc:
        return f"{shown}: {exc}."
    if model_config is None:
        depth, where = None, ""
        if parsed is None:
            return ""
    else:
        depth, where = model_info.text_model_layers(dict(model_config)), f" with hsextract_model_path={model_path}"
        if depth is None:
            return (
                f"hsextract_model_path={model_path}: its config.json gives no num_hidden_layers "
                "(needed to place the capture layers)."
            )
        if parsed is None:
            shown += " (the EAGLE-3 default)"
    try:
        layers.resolve(parsed, depth, str(convention))
    except ConfigError as exc:
        return f"{shown}{where}: {exc}."
    return ""


def regenerated_dir_problem(regenerated_dir: str, dataset: str) -> str:
    """What is wrong with ``hsextract_regenerated_dir`` ("" if nothing): the regeneration writes
    it while it reads the dataset, so it must be an absolute path outside the dataset."""
    out, src = posixpath.normpath(str(regenerated_dir)), posixpath.normpath(str(dataset))
    if posixpath.isabs(out) and out != src and not out.startswith(src.rstrip("/") + "/"):
        return ""
    return (
        "hsextract_regenerated_dir must be an absolute path on the host outside the dataset (the regeneration "
        f"would read what it writes); got hsextract_regenerated_dir='{regenerated_dir}', "
        f"hsextract_dataset='{dataset}'."
    )


def dataset_switch_problem(
    record_text: str, output_dir: str, extract_dataset: str, regenerated_dir: str, regenerate: bool
) -> str:
    """Whether switching the regeneration on or off would resume a training set of the other dataset.

    The client resumes by sample index and refuses another dataset at its start (its record's
    fingerprint), but only after a regeneration of hours. The play knows only paths: the record
    (`record_text`, the output's dataset record as the client wrote it) names the dataset the
    set was extracted from, and the two datasets of a run are hsextract_dataset and
    hsextract_regenerated_dir. A set of one of them resumed from the other is refused ("" when
    the set's dataset is the one the extraction reads, or is neither of the two).
    """
    record_file = layout.dataset_record_path(output_dir)
    try:
        record = json.loads(record_text)
        recorded_path = str(record.get("path", "")) if isinstance(record, dict) else ""
    except ValueError as exc:
        return (
            f"{record_file}: unreadable ({exc}); it records which dataset the training set in "
            f"hsextract_output_dir={output_dir} was extracted from. Restore it, or set hsextract_output_dir "
            "to a new directory."
        )
    recorded = posixpath.normpath(recorded_path)
    reads = posixpath.normpath(str(extract_dataset))
    regenerated = posixpath.normpath(str(regenerated_dir))
    if recorded == reads or regenerated not in (recorded, reads):
        return ""
    regenerate = bool(regenerate)
    return (
        f"hsextract_output_dir={output_dir} holds a training set extracted from {recorded} (recorded in "
        f"{record_file}), but with hsextract_regenerate={regenerate} the extraction reads {reads} (expected: the "
        "set's dataset is the one the extraction reads). Resumed, the client would skip every sample index already "
        f"written and keep the samples of {recorded} under them. Set hsextract_output_dir to a new directory for "
        f"this dataset, or hsextract_regenerate back to {not regenerate} to go on with the training set of "
        f"{recorded}."
    )


def _layout_files() -> dict[str, Callable[[str], Path]]:
    """hsextract.output.layout's ``<name>_path(directory)`` functions (any further parameter has a default:
    a client file's shard is the whole dataset's), by name."""

    def takes_one(function: Callable) -> bool:
        params = inspect.signature(function).parameters.values()
        return sum(p.default is inspect.Parameter.empty for p in params) == 1

    return {
        name[: -len("_path")]: function
        for name, function in vars(layout).items()
        if name.endswith("_path") and callable(function) and takes_one(function)
    }


def layout_path(directory: str, name: str, shard: str = "") -> str:
    """The path of a run's file `name` in `directory` (an output or staging directory), as
    `hsextract.output.layout.<name>_path` gives it: e.g. ``output | hsextract_layout_path('client_summary')``;
    a client file of a shard's client with ``shard='i/n'``."""
    files = _layout_files()
    if name not in files:
        raise ValueError(
            f"hsextract_layout_path: hsextract.output.layout has no file {name!r}; it has {', '.join(sorted(files))}"
        )
    if shard:
        return str(files[name](str(directory), _Shard.parse(shard)))  # type: ignore[call-arg]
    return str(files[name](str(directory)))


def output_problem(output_dir: str, credentials_src: str = "", endpoint: str = "") -> str:
    """What is wrong with an ``hsextract_output_dir`` of ``s3://bucket/prefix`` and its object-store
    settings ("" for a directory, or when nothing is): the URL, the endpoint's form, and the
    controller's credentials file (its mode 0600 and its keys; never what they are)."""
    output_dir = str(output_dir)
    if not store_url.is_object_url(output_dir):
        return ""
    try:
        store_url.parse_object_url(output_dir, "hsextract_output_dir")
        store_settings.settings_from(str(endpoint or ""), "", "")
        if credentials_src:
            store_settings.read_credentials_file(str(credentials_src))
    except ConfigError as exc:
        text = (
            str(exc)
            .replace("--s3-credentials", "hsextract_s3_credentials_src")
            .replace("--s3-endpoint", "hsextract_s3_endpoint")
        )
        return f"{text}."
    return ""


class FilterModule:
    """The filters, as Ansible names them."""

    def filters(self) -> dict[str, Callable[..., str]]:
        return {
            "hsextract_rid_prefix_problem": rid_prefix_problem,
            "hsextract_shard_problem": shard_problem,
            "hsextract_precision_problem": precision_problem,
            "hsextract_aux_layer_problem": aux_layer_problem,
            "hsextract_regenerated_dir_problem": regenerated_dir_problem,
            "hsextract_dataset_switch_problem": dataset_switch_problem,
            "hsextract_layout_path": layout_path,
            "hsextract_client_processes_problem": client_processes_problem,
            "hsextract_process_shards": process_shards,
            "hsextract_summary_path": summary_path,
            "hsextract_output_problem": output_problem,
        }
