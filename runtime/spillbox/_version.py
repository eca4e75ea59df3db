"""The version of spillbox: the package metadata is built from it."""

__version__ = "0.1.0"
