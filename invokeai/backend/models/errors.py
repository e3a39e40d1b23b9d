"""The one error probing and loading raise for a path that is not a model this server can use."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """`reason` says, for a person, why the path was refused (missing, corrupt, truncated, unknown layout...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
