"""``python -m oga``: the oga command line (see oga/cli.py)."""
import sys

from .cli import main

sys.exit(main())
