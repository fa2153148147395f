"""``python -m coordinator`` runs the ``commitfleet`` CLI."""

from ._cli import main

main()
