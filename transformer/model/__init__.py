"""The network and nothing else: masks, attention, positions and embeddings, layers, the Transformer.

Imports only the shared ``transformer.config``; knows nothing of data, training, inference or the commands.
"""
