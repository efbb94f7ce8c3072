"""Using a trained model: loading it from a checkpoint, greedy and beam search, ensembles, translating and
scoring text, attention maps.

Imports the model, the data and the shared modules; never training or the commands.
"""
