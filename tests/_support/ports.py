"""Free loopback ports for services the tests start themselves (the same helper the demo uses)."""

from coordinator.demo import free_port

__all__ = ["free_port"]
