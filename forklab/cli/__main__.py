"""``python -m forklab.cli``: the ``forklab`` command."""

from forklab.cli.main import main

main()
