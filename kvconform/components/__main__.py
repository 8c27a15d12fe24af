"""``python -m kvconform.components <component> [...]``: the same as ``kvconform serve``."""

import sys

from kvconform.components import main

sys.exit(main())
