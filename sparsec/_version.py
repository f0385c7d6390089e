"""The package version, in a leaf module so that nothing inside sparsec imports the root."""
__version__ = "0.1.0"
