#!/usr/bin/env python
"""fltune's command line: ``python cli.py --help``."""

import sys

from fltune.cli import main

if __name__ == "__main__":
    sys.exit(main())
