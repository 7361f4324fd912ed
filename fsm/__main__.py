"""``python -m fsm``: the ``fsm`` command, for an environment whose scripts are not on PATH."""

from __future__ import annotations

import sys

from fsm.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
