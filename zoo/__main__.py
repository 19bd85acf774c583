"""``python -m zoo build|list``: see :mod:`zoo`."""

import sys

from zoo import main

sys.exit(main())
