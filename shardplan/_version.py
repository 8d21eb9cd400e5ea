"""The one place the version is written. ``shardplan.__version__`` re-exports it (pyproject.toml
reads it there); a module of its own so that the value objects can record it without importing
the package facade (``shardplan/__init__.py`` imports capture, which imports ``shardplan.ir``)."""

__version__ = "0.1.0"
