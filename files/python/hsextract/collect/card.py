"""The collected set's dataset card (``README.md``): what it holds, where it came from, how to load it.

A training set of many hosts outlives the run that made it and is handed to people who never saw
the fleet; the card tells them in one page what the manifest header, the hosts' records and the
reconciliation say. It holds no time stamp, so a collect that changes nothing rewrites nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hsextract.formats import FORMATS
from hsextract.model_fingerprint import PART_NAMES
from hsextract.output.manifest import ManifestHeader


@dataclass(frozen=True)
class HostLine:
    name: str
    shards: str  # "0/3" or "0/6, 3/6"
    collected: int
    state: str  # "finished", "extracting", ...


def card_text(
    path: str,
    header: ManifestHeader,
    samples: int,
    tokens: int,
    nbytes: int,
    hosts: Sequence[HostLine],
    dataset: dict[str, Any] | None,
    dataset_lines: int | None,
    accounts: Sequence[str],
    vocab: dict[str, Any] | None,
) -> str:
    """The card's Markdown."""
    spec = FORMATS.get(header.format)
    lines = [
        *_about_lines(header, samples, tokens, nbytes, len(hosts), dataset, dataset_lines),
        "## Hosts",
        "",
        "| host | shards | samples collected | state |",
        "| --- | --- | --- | --- |",
        *(f"| {h.name} | {h.shards} | {h.collected} | {h.state} |" for h in hosts),
        "",
        "## Every sample accounted for",
        "",
        "```",
        *accounts,
        "```",
        "",
        "Rejected rows are in `.hsextract/rejects.jsonl`, failed samples (with their host and reason) in "
        "`.hsextract/failures.jsonl`, quarantined ones in `quarantine/`.",
        "",
        *_vocab_lines(vocab),
        "## Loading it",
        "",
        _loading(spec, header).replace("<set>", path),
        "",
        "`manifest.jsonl` maps each sample's output index to its dataset index, its host (`host`) and its index "
        "there (`host_index`), with its size, checksum and fingerprint; `hsextract finalize --output <set> "
        "--verify` re-checks every file.".replace("<set>", path),
        "",
    ]
    return "\n".join(lines)


def _about_lines(
    header: ManifestHeader,
    samples: int,
    tokens: int,
    nbytes: int,
    hosts: int,
    dataset: dict[str, Any] | None,
    dataset_lines: int | None,
) -> list[str]:
    """The title, where the states come from, and the table of what every sample has in common."""
    spec = FORMATS.get(header.format)
    model = header.model_path or "?"
    return [
        f"# EAGLE-3 training data: {model.rstrip('/').rsplit('/', 1)[-1]}",
        "",
        f"Hidden states of `{model}` ({header.architecture or '?'}, {header.num_hidden_layers} layers), captured "
        f"inside SGLang {header.sglang_version or '?'}'s forward pass by hsextract {header.hsextract_version or '?'} "
        f"on {hosts} host(s) and collected by `hsextract collect`. Every sample was re-hashed against its "
        "host's manifest before it was added.",
        "",
        "| | |",
        "| --- | --- |",
        f"| format | `{header.format}` ({spec.trainer if spec else '?'}) |",
        f"| samples | {samples} ({tokens} tokens, {nbytes} bytes of sample files) |",
        f"| aux layers | {header.eagle_aux_hidden_state_layer_ids} (eagle convention), "
        f"{header.sglang_layers_to_capture} (sglang) |",
        f"| final hidden state | {header.final_hidden} |",
        f"| dtype, hidden size | {header.dtype}, {header.hidden_size} |",
        f"| precision | {_precision(header)} |",
        f"| model config sha256 | `{header.model_config_sha256 or '?'}` |",
        f"| model fingerprint | {_fingerprint(header.model_fingerprint)} |",
        f"| dataset | `{(dataset or {}).get('path', '?')}`, {'?' if dataset_lines is None else dataset_lines} lines |",
        f"| run id | `{header.run_id}` |",
        "",
    ]


def _precision(header: ManifestHeader) -> str:
    """How the set stores the rows, in a table cell."""
    if header.precision == "fp8":
        return "fp8: float8_e4m3fn rows, one float32 scale per token (`hidden_states_scales`); read dequantized to bf16"
    converted = header.extra.get("converted_from")
    if converted:
        return f"{header.precision}: {converted} (`hsextract collect --to-bf16`)"
    return f"{header.precision}: the rows as captured"


def _loading(spec: Any, header: ManifestHeader) -> str:
    """How the format's trainer loads the set: its own line, and what it is told of FP8 rows."""
    if spec is None:
        return ""
    return spec.loading + (f" FP8 rows: {spec.fp8_loading}" if header.precision == "fp8" else "")


def _vocab_lines(vocab: dict[str, Any] | None) -> list[str]:
    if not vocab:
        return []
    sizes = ", ".join(f"{s['size']} (covers {s['coverage']:.1%} of the trained-on tokens)" for s in vocab["sizes"])
    return [
        "## Draft vocabulary",
        "",
        f"Counted over the {vocab['masked_tokens']} loss-masked tokens ({vocab['distinct_tokens']} distinct) of "
        f"all hosts' samples; sizes {sizes or 'none'}. `draft_vocab.json` lists every trainer's files.",
        "",
    ]


def _fingerprint(fp: dict[str, str]) -> str:
    """The model's fingerprint in a table cell: each part's digest, shortened (hsextract.model_fingerprint)."""
    if not fp:
        return "none recorded"
    return ", ".join(f"{PART_NAMES[p]} `{(fp.get(p) or '?')[:16]}`" for p in PART_NAMES)
