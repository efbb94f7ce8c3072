"""Encoder-decoder Transformer for translation: model, data pipeline, training and evaluation.

The public names most users need, each imported from its module on first use (PEP 562), so that importing one
part (``transformer.model``, say) loads neither the others nor the commands. Everything else lives in its own
module (see the README's layout).
"""

from __future__ import annotations

import importlib
from typing import Any

from transformer.version import __version__ as __version__  # the one version: pyproject.toml reads it there

_HOMES = {
    "transformer.config": ("AttentionConfig", "AttentionScore", "DataConfig", "EvalConfig", "ModelConfig",
                           "PositionKind", "TokenizerConfig", "TrainConfig", "TrainingConfig"),
    "transformer.app.schemas": ("EvaluateConfig", "TranslateConfig"),
    "transformer.inference.loading": ("TrainedModel", "load_trained"),
    "transformer.inference.search": ("Hypothesis", "beam_search", "greedy_search"),
    "transformer.inference.translator": ("Translator",),
    "transformer.model.attention": ("MultiHeadAttention", "additive_scores", "scaled_dot_product_attention"),
    "transformer.model.transformer": ("DecoderCache", "EncoderOutput", "Transformer", "build_model"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'transformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value  # found here from now on
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
