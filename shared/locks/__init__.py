"""The per-name storage lock (conditional writes, heartbeat, expiry takeover, fencing epoch)."""

from ._lease import Lease

__all__ = ["Lease"]
