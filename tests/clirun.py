"""Run the CLI in-process in tests: exit code, stdout and stderr."""

import json

from layoutsearch import cli


def run(capsys, *argv):
    """``layoutsearch ARGV...``: (exit code, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    """``layoutsearch ARGV... --json``, which must succeed: the parsed JSON."""
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)
