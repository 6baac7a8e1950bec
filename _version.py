"""The package version: the one place it is written (pyproject.toml reads it, `radixlm.__version__`
re-exports it, the server reports it). Imports nothing, so any layer may import it."""

__version__ = "0.1.0"
