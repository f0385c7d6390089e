"""sparsec's version, in a leaf module: the modules that record it (exported modules, tuning
records, benchmark results) import it from here, never from the package root."""
__version__ = "0.1.0"
