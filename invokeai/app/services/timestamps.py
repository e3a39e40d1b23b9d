"""The timestamps the services store: ISO 8601 in UTC with a fixed precision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def now_iso() -> str:
    """Now, as ISO 8601 in UTC to the microsecond. The fixed precision keeps the strings in time order when they
    are compared or sorted as text."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def iso_in(seconds: float) -> str:
    """`seconds` from now, as now_iso writes times (so that the two compare as text)."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat(timespec="microseconds")
