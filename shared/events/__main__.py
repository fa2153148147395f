"""``python -m shared.events``: print, write or check the JSON Schema files.

No flag prints the queue-event schema (``--admin``: the admin-event schema);
``--write`` regenerates stale files under ``shared/schema/``; ``--check``
exits 1 when any file is stale.
"""

from __future__ import annotations

import argparse
import sys

from ._schema import (
    admin_event_schema,
    queue_event_schema,
    render_schema,
    stale_schema_files,
    write_schema_files,
)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 stale schema files)."""
    parser = argparse.ArgumentParser(prog="python -m shared.events", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="regenerate stale schema files")
    group.add_argument("--check", action="store_true", help="exit 1 when schema files are stale")
    group.add_argument("--admin", action="store_true", help="print the admin-event schema")
    args = parser.parse_args(argv)
    if args.write:
        for path in write_schema_files():
            print(f"wrote {path}")
        return 0
    if args.check:
        stale = stale_schema_files()
        for path in stale:
            print(f"stale: {path} (run: python -m shared.events --write)", file=sys.stderr)
        return 1 if stale else 0
    sys.stdout.write(render_schema(admin_event_schema() if args.admin else queue_event_schema()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
