"""The ``meshfeed`` command line as the package's console script (and ``python -m meshfeed``).

It runs the same Rust code as the ``meshfeed`` binary (``_meshfeed.cli_main``), with the same
arguments, output and exit codes.
"""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

from . import _meshfeed


def main() -> NoReturn:
    # The command line decides what SIGINT and SIGTERM do, as the binary does: `run`,
    # `serve` and `launch` handle them (a stop at a step boundary, exit code 75), the other
    # commands die of them. Python's own SIGINT handler would stay chained behind the
    # command's and raise KeyboardInterrupt once it returned: the binary's dispositions
    # (the defaults) are restored first.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    # The program's name is `meshfeed` in usage and errors however it was started; `launch`
    # starts its ranks with this interpreter and `-m meshfeed` (the interpreter, not a
    # meshfeed binary, is this process's executable).
    code = _meshfeed.cli_main(["meshfeed", *sys.argv[1:]], [sys.executable, "-m", "meshfeed"])
    sys.exit(code)
