"""The package's version, kept once: the distribution's metadata (``pyproject.toml``) reads it from here."""

__version__ = "0.9.19"
