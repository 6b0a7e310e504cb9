"""`peakbound` (the wheel's console script) and `python -m peakbound`: the CLI this
package carries, run with the same arguments (it replaces this process)."""

import os
import sys


def main() -> None:
    from . import cli_path  # sets OPENBLAS_CORETYPE as the CLI itself would

    exe = cli_path()
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"peakbound: error: the package's CLI is missing at {exe} (reinstall the package)\n")
        sys.exit(2)
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
