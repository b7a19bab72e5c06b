#!/usr/bin/env python3
"""Run the layoutsearch command line from a checkout: ``python cli.py models``."""

import sys

from layoutsearch.cli import main

if __name__ == "__main__":
    sys.exit(main())
