"""The console script's entry (``stallscope``, ``python -m stallscope``): the smallest module that can catch a Ctrl-C.

``cli.main`` catches a Ctrl-C once its handler runs, but importing it (argparse, tempfile, traceback and stallscope's
settings) and setting up its output (rich) take tens of milliseconds before that, and a Ctrl-C pressed then (a user who
changed their mind at once, ``timeout -s INT`` with a short limit) printed a ``KeyboardInterrupt`` traceback from inside
an import. With this entry only the first few tens of milliseconds still can: the interpreter's start and the script pip
writes, which imports this module (calibration: cli-interrupt-window).
"""

from __future__ import annotations

import sys

#: Exit status after a Ctrl-C, as a shell reports a job killed by SIGINT (128 + 2); ``cli.main`` returns it too.
INTERRUPTED_EXIT = 130


def main() -> int:
    """Run the verb; a Ctrl-C that ``cli.main`` could not catch yet (its import, the output set-up before its own
    handler, which imports rich) is ``interrupted`` with exit code 130 all the same."""
    try:
        from stallscope.cli.main import main as run_verb

        return run_verb()
    except KeyboardInterrupt:
        print("stallscope: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT
