"""``python -m sparsec.cli``: the ``sparsec`` command."""
import sys

from . import main

sys.exit(main())
