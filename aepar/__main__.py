"""``python -m aepar``: the aepar command (aepar.command)."""
import sys

from aepar.command import main

sys.exit(main())
