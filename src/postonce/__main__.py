"""``python -m postonce``: the same as the ``postonce`` command."""

from ._cli import main

main()
