"""`python -m kvconform ...` is the `kvconform` command."""

import sys

from kvconform.cli import main

sys.exit(main())
