"""``python -m torchsparse_pp ...``: the ``torchsparse-pp`` command where the script is not on the PATH."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
