"""Encoder-decoder Transformer for translation: model, data pipeline, training and evaluation.

The public names most users need; everything else lives in its own module (see the README's layout).
"""

from transformer.app.schemas import EvaluateConfig, TranslateConfig
from transformer.config import (
    AttentionConfig,
    AttentionScore,
    DataConfig,
    EvalConfig,
    ModelConfig,
    PositionKind,
    TokenizerConfig,
    TrainConfig,
    TrainingConfig,
)
from transformer.inference.loading import TrainedModel, load_trained
from transformer.inference.search import Hypothesis, beam_search, greedy_search
from transformer.model.attention import MultiHeadAttention, additive_scores, scaled_dot_product_attention
from transformer.model.transformer import DecoderCache, EncoderOutput, Transformer, build_model

__all__ = [
    "AttentionConfig",
    "AttentionScore",
    "DataConfig",
    "DecoderCache",
    "EncoderOutput",
    "EvalConfig",
    "EvaluateConfig",
    "Hypothesis",
    "ModelConfig",
    "MultiHeadAttention",
    "PositionKind",
    "TokenizerConfig",
    "TrainConfig",
    "TrainedModel",
    "Transformer",
    "TrainingConfig",
    "TranslateConfig",
    "additive_scores",
    "beam_search",
    "build_model",
    "greedy_search",
    "load_trained",
    "scaled_dot_product_attention",
]
