#!/usr/bin/env python3
"""Run the layoutsearch command line from a checkout: ``python cli.py models``."""

from layoutsearch.cli import run

if __name__ == "__main__":
    run()
