"""Client state: the small key/value store InvokeAI's web UI keeps its settings in (each value a string, usually
JSON text). As InvokeAI keys it, by user and key: the queue id of the routes is not part of it. This server has one
user. Bounded: key length, value size and the number of keys."""

from __future__ import annotations

from invokeai.app.services.database import Database
from invokeai.app.services.timestamps import now_iso

SYSTEM_USER = "system"
MAX_KEY_LENGTH = 255
# InvokeAI's web UI stores a slice of its state per key (canvas, gallery, parameters...): tens of kB at most.
MAX_VALUE_LENGTH = 1024 * 1024
MAX_KEYS = 256


class ClientStateFullError(RuntimeError):
    pass


class ClientStateValueTooLargeError(ValueError):
    pass


class ClientStateService:
    def __init__(self, db: Database, max_keys: int = MAX_KEYS, max_value_length: int = MAX_VALUE_LENGTH) -> None:
        self._db = db
        self.max_keys = max_keys
        self.max_value_length = max_value_length

    def get(self, key: str) -> str | None:
        rows = self._db.execute("SELECT value FROM client_state WHERE user_id = ? AND key = ?", (SYSTEM_USER, key))
        return rows[0][0] if rows else None

    def set(self, key: str, value: str) -> str:
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"a key has at most {MAX_KEY_LENGTH} characters")
        if len(value) > self.max_value_length:
            raise ClientStateValueTooLargeError(
                f"the value is {len(value)} characters; a value has at most {self.max_value_length}"
            )
        with self._db.transaction() as cursor:
            known = cursor.execute(
                "SELECT 1 FROM client_state WHERE user_id = ? AND key = ?", (SYSTEM_USER, key)
            ).fetchone()
            if known is None:
                count = int(
                    cursor.execute("SELECT COUNT(*) FROM client_state WHERE user_id = ?", (SYSTEM_USER,)).fetchone()[0]
                )
                if count >= self.max_keys:
                    raise ClientStateFullError(
                        f"the client state holds {count} keys, the most it keeps: delete one before adding another"
                    )
            cursor.execute(
                "INSERT INTO client_state (user_id, key, value, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (user_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                (SYSTEM_USER, key, value, now_iso()),
            )
        return value

    def keys_by_prefix(self, prefix: str) -> list[str]:
        """The keys starting with `prefix` (taken literally, case and all), most recently set first."""
        # At most max_keys rows; compared here, because the engines' LIKE differ on case.
        rows = self._db.execute(
            "SELECT key FROM client_state WHERE user_id = ? ORDER BY updated_at DESC, key", (SYSTEM_USER,)
        )
        return [row[0] for row in rows if row[0].startswith(prefix)]

    def delete(self, key: str) -> None:
        self._db.execute("DELETE FROM client_state WHERE user_id = ? AND key = ?", (SYSTEM_USER, key))

    def delete_all(self) -> None:
        self._db.execute("DELETE FROM client_state WHERE user_id = ?", (SYSTEM_USER,))
