"""Encoder-decoder Transformer for translation: model, data pipeline, training and evaluation.

The public names most users need; everything else lives in its own module (see the README's layout).
"""

from transformer.attention import MultiHeadAttention, scaled_dot_product_attention
from transformer.config import (
    DataConfig,
    EvalConfig,
    EvaluateConfig,
    ModelConfig,
    TokenizerConfig,
    TrainConfig,
    TrainingConfig,
    TranslateConfig,
)
from transformer.decoding import Hypothesis, beam_search, greedy_search
from transformer.inference import TrainedModel, load_trained
from transformer.model import DecoderCache, EncoderOutput, Transformer, build_model

__all__ = [
    "DataConfig",
    "DecoderCache",
    "EncoderOutput",
    "EvalConfig",
    "EvaluateConfig",
    "Hypothesis",
    "ModelConfig",
    "MultiHeadAttention",
    "TokenizerConfig",
    "TrainConfig",
    "TrainedModel",
    "Transformer",
    "TrainingConfig",
    "TranslateConfig",
    "beam_search",
    "build_model",
    "greedy_search",
    "load_trained",
    "scaled_dot_product_attention",
]
