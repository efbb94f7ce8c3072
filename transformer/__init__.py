"""Encoder-decoder Transformer for translation: model, data pipeline, training and evaluation."""
