"""``python -m inflight.cli``: the ``inflight`` command."""

from inflight.cli import main

main()
