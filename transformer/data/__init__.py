"""Parallel corpora and their ids: reading and checking files, downloads, tokenizers, the encoded cache,
token-budget batches and subword sampling.

Imports only the shared modules; knows nothing of the model, training, inference or the commands.
"""
