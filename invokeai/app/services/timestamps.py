"""The timestamps the services store: ISO 8601 in UTC with a fixed precision."""

from __future__ import annotations

from datetime import UTC, datetime


def now_iso() -> str:
    """Now, as ISO 8601 in UTC to the microsecond. The fixed precision keeps the strings in time order when they
    are compared or sorted as text."""
    return datetime.now(UTC).isoformat(timespec="microseconds")
