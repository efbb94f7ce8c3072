"""Training a model: the objective, the optimiser and schedule, the loop and its step, when to stop, writing
checkpoints and resuming, GloVe initialisation, CUDA graphs and distributed processes.

Imports the model, the data, inference (for validation) and the shared modules; never the commands.
"""
