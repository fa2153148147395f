"""``python -m coordinator`` runs the ``commitfleet`` CLI."""

from .cli import main

main()
