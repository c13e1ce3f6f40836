"""``python -m bench --suite quick|full``: see :mod:`bench.suite`."""
import sys

from .suite import main

sys.exit(main())
