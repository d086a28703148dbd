#!/usr/bin/env python
"""fltune's command line: ``python cli.py --help``."""

import sys

from fltune.cli import entry

if __name__ == "__main__":
    sys.exit(entry())
