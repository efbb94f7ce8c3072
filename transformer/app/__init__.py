"""The commands: their config schemas, the console entry points, the pipelines that wire the parts together,
the benchmark and the recipes. The only part that imports every other; nothing imports it.
"""
