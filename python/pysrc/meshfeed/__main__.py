"""``python -m meshfeed ...``: the ``meshfeed`` command line (as the console script)."""

from ._cli import main

main()
