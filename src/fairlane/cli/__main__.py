"""``python -m fairlane.cli``: the same as the ``fairlane`` script."""

from fairlane.cli import main

main()
