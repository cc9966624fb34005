"""Load the model's tokenizer by the shortest import path that gives the same tokenizer.

``AutoTokenizer`` resolves a tokenizer's class from the model's files, and importing it makes
transformers import torch (its generation utilities, which the auto classes pull in): 10-15 s of
the client's start-up on a GPU host beside running servers, against a fraction of a second for
the tokenizer's own files (`bench/gpu/pipeline_gpu.py`'s tokenizer phase, taken apart).

``AutoTokenizer`` does not always build the class the files name: for some model types it
overrides a generic class named by the hub with one of its own
(``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``), and those classes tokenize differently. So the
direct path is taken only where it is known to be what ``AutoTokenizer`` builds: the files name the
generic fast tokenizer (Llama 3's do, and the project's tiny models'), with no code of their own
(``auto_map``), for a model type of ``GENERIC_MODEL_TYPES``, for which the tests check, against the
installed transformers, that ``AutoTokenizer`` builds that same class. Anything else goes through
``AutoTokenizer``.

Where the direct path is taken, the tokenizer is loaded without transformers at all
(`hsextract.dataset.direct_tokenizer`) unless one of that module's premises fails; then it is
transformers' generic class, imported directly.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hsextract.dataset.direct_tokenizer import NotDirect, load_direct, read_json_object

log = logging.getLogger(__name__)

# The classes AutoTokenizer maps to the generic fast tokenizer (transformers 5 names it
# TokenizersBackend and keeps PreTrainedTokenizerFast as its alias).
GENERIC_FAST_CLASSES = frozenset({"PreTrainedTokenizerFast", "TokenizersBackend"})
# Model types for which AutoTokenizer keeps a generic class that the files name (checked against the
# installed transformers by tests/dataset/test_tokenizer_files.py).
GENERIC_MODEL_TYPES = frozenset({"llama", "deepseek_v3"})


def generic_fast_tokenizer(model_dir: Path) -> bool:
    """True when AutoTokenizer would build the generic fast tokenizer the directory's files name
    (see the module docstring)."""
    cfg = read_json_object(model_dir / "tokenizer_config.json")
    return (
        cfg.get("tokenizer_class") in GENERIC_FAST_CLASSES
        and "auto_map" not in cfg
        and read_json_object(model_dir / "config.json").get("model_type") in GENERIC_MODEL_TYPES
        and (model_dir / "tokenizer.json").is_file()
    )


def from_pretrained(model_dir: Path) -> Any:
    """The tokenizer of ``model_dir``: the generic fast class imported directly where that is what
    AutoTokenizer would build (see the module docstring), else AutoTokenizer's."""
    if generic_fast_tokenizer(model_dir):
        try:
            return load_direct(model_dir)
        except NotDirect as why:
            log.info("loading the tokenizer of %s through transformers: %s", model_dir, why)
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))
