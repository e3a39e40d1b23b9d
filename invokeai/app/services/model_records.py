"""Model records: what is installed (name, family, type, format, where, how big, its hash), one row each in the
database.

Nodes name a model with a `ModelIdentifier` (its key or its name); the model manager resolves it to a record here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from invokeai.app.services.database import Database, IntegrityError, Row
from invokeai.app.services.timestamps import now_iso
from invokeai.backend.families import family_names

# The registered families' names, so the OpenAPI document lists them and a record of another family is refused.
ModelFamily = Literal[family_names()]  # type: ignore[valid-type]
ModelFormat = Literal["diffusers", "checkpoint", "gguf"]

# A name doubles as a folder or file name under models_dir: no separators, no leading dot, nothing a shell or
# a filesystem treats specially.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,99}$"
_NAME_RE = re.compile(MODEL_NAME_PATTERN)

# Fields a record may change after install; the rest describe the files and change only by reinstalling.
MUTABLE_FIELDS = frozenset({"name", "description", "trigger_phrases", "default_settings"})
# Stored as JSON text (migration 7).
_JSON_FIELDS = ("trigger_phrases", "default_settings")


class ModelIdentifier(BaseModel):
    """A model, named in a graph by its key or by its name. InvokeAI's clients send its ModelIdentifierField, {key,
    hash, name, base, type} with all of them set: the key then names the model, as in InvokeAI, and the rest is
    what the client believed of it (kept, not checked). InvokeAI's web UI sends the whole model record there; as in
    InvokeAI, the fields besides these are ignored."""

    key: str | None = Field(default=None, description="The model's key, as GET /api/v2/models/ lists it.")
    name: str | None = Field(
        default=None,
        description="The model's unique name, as GET /api/v2/models/ lists it; names the model when no key is given.",
    )
    hash: str | None = Field(default=None, description="InvokeAI's field: the model's hash, as the client knew it.")
    base: str | None = Field(default=None, description="InvokeAI's field: the model's base, as the client knew it.")
    type: str | None = Field(default=None, description="InvokeAI's field: the model's type, as the client knew it.")
    submodel_type: str | None = Field(default=None, description="InvokeAI's field: a part of the model, or null.")

    @model_validator(mode="after")
    def _named(self) -> ModelIdentifier:
        if self.key is None and self.name is None:
            raise ValueError("a model is named by its 'key' or its 'name'; neither is given")
        return self

    def __str__(self) -> str:
        return f"key {self.key!r}" if self.key is not None else f"name {self.name!r}"

    @property
    def token(self) -> str:
        return model_token(self.key, self.name)


def model_token(key: str | None = None, name: str | None = None) -> str:
    """One model as a string that compares equal however a graph names it: `key:<key>` or `name:<name>` (names
    are unique case-insensitively, so lowercased). What a queue item's `models` and a worker's device hold."""
    return f"key:{key}" if key is not None else f"name:{(name or '').lower()}"


class ModelRecord(BaseModel):
    key: str = Field(description="Unique, made by the server at install.")
    name: str = Field(description="Unique (case-insensitively); graphs may name the model by it.")
    family: ModelFamily = Field(description="The model family: which nodes can use it.")
    type: str = Field(
        description="main (a whole pipeline), or the type of the one component a single file holds, in InvokeAI's "
        "words: transformer, vae, qwen3_encoder ..."
    )
    format: ModelFormat = Field(description="diffusers (a pipeline folder), checkpoint (one safetensors), gguf.")
    path: str = Field(description="Where the model is on the server's disk.")
    size: int = Field(description="Bytes on disk.")
    hash: str | None = Field(description="sha256:<hex> of the files; null when hash_models is off.")
    source: str = Field(description="The path it was installed from.")
    description: str | None = Field(default=None)
    config_variant: str | None = Field(
        default=None, description="The shipped config a single file loads with; null for a diffusers folder."
    )
    source_type: Literal["path", "url", "hf_repo_id"] = Field(
        default="path", description="What `source` is, in InvokeAI's words: a path on the server (so far the only one)."
    )
    trigger_phrases: list[str] | None = Field(default=None, description="Phrases that bring out what it was tuned on.")
    default_settings: dict[str, Any] | None = Field(
        default=None, description="Settings the user gave it (InvokeAI's MainModelDefaultSettings); null: none."
    )


class ModelNotFoundError(KeyError):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class DuplicateModelNameError(ValueError):
    pass


class InvalidModelNameError(ValueError):
    pass


def check_model_name(name: str) -> str:
    if not _NAME_RE.match(name) or name.endswith((" ", ".")):
        raise InvalidModelNameError(
            f"invalid model name {name!r}: use up to 100 letters, digits, '.', '_', '-' and spaces, starting with a "
            "letter or digit and not ending with a space or '.'"
        )
    return name


_COLUMNS = tuple(ModelRecord.model_fields)


def _record(row: Row) -> ModelRecord:
    values = {column: row[column] for column in _COLUMNS}
    for field in _JSON_FIELDS:
        if values[field] is not None:
            values[field] = json.loads(values[field])
    return ModelRecord(**values)


def _stored(values: dict[str, Any]) -> dict[str, Any]:
    """`values` as the columns hold them: the JSON fields as text."""
    return {
        field: json.dumps(value) if field in _JSON_FIELDS and value is not None else value
        for field, value in values.items()
    }


class ModelRecordService:
    def __init__(self, db: Database) -> None:
        self._db = db

    def add(self, record: ModelRecord, *, owned: bool = False) -> ModelRecord:
        """Store `record`. owned: its files were put there by the server, and `delete` removes them."""
        check_model_name(record.name)
        now = now_iso()
        values = {**_stored(record.model_dump()), "owned": int(owned), "created_at": now, "updated_at": now}
        columns = ", ".join(values)
        marks = ", ".join(f":{column}" for column in values)
        try:
            with self._db.transaction() as cursor:
                cursor.execute(f"INSERT INTO models ({columns}) VALUES ({marks})", values)
        except IntegrityError:
            raise self._conflict(record.name, record.key) from None
        return record

    def _conflict(self, name: str, key: str) -> Exception:
        if self._db.execute("SELECT 1 FROM models WHERE key = ?", (key,)):
            return DuplicateModelNameError(f"a model with key {key!r} already exists")
        return DuplicateModelNameError(f"a model named {name!r} already exists")

    def get(self, key: str) -> ModelRecord:
        rows = self._db.execute("SELECT * FROM models WHERE key = ?", (key,))
        if not rows:
            raise ModelNotFoundError(f"no model with key {key!r}")
        return _record(rows[0])

    def get_by_name(self, name: str) -> ModelRecord:
        # lower(): names are unique case-insensitively (migration 3); on PostgreSQL its index answers this.
        rows = self._db.execute("SELECT * FROM models WHERE lower(name) = lower(?)", (name,))
        if not rows:
            raise ModelNotFoundError(f"no model named {name!r}")
        return _record(rows[0])

    def exists(self, name: str) -> bool:
        return bool(self._db.execute("SELECT 1 FROM models WHERE lower(name) = lower(?)", (name,)))

    def list(self, family: str | None = None, type: str | None = None) -> list[ModelRecord]:
        """Every record (optionally of one family and/or type), by name."""
        rows = self._db.execute(
            # CAST: PostgreSQL must know a parameter's type, and a NULL alone does not say it.
            "SELECT * FROM models WHERE (CAST(:family AS TEXT) IS NULL OR family = :family) "
            "AND (CAST(:type AS TEXT) IS NULL OR type = :type) ORDER BY lower(name), key",
            {"family": family, "type": type},
        )
        return [_record(row) for row in rows]

    def count(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) AS n FROM models")[0]["n"])

    def is_owned(self, key: str) -> bool:
        rows = self._db.execute("SELECT owned FROM models WHERE key = ?", (key,))
        if not rows:
            raise ModelNotFoundError(f"no model with key {key!r}")
        return bool(rows[0]["owned"])

    def update(self, key: str, changes: dict[str, Any]) -> ModelRecord:
        """Change the name, description, trigger phrases or default settings; other fields describe the files and
        cannot change."""
        unknown = set(changes) - MUTABLE_FIELDS
        if unknown:
            raise ValueError(f"cannot change {', '.join(sorted(unknown))}: only {', '.join(sorted(MUTABLE_FIELDS))}")
        if changes.get("name") is not None:
            check_model_name(changes["name"])
        elif "name" in changes:
            raise InvalidModelNameError("a model's name cannot be null")
        with self._db.transaction() as cursor:
            current = self.get(key)
            if not changes:
                return current
            assignments = ", ".join(f"{field} = :{field}" for field in changes)
            try:
                cursor.execute(
                    f"UPDATE models SET {assignments}, updated_at = :updated_at WHERE key = :key",
                    {**_stored(changes), "updated_at": now_iso(), "key": key},
                )
            except IntegrityError:
                raise DuplicateModelNameError(f"a model named {changes['name']!r} already exists") from None
        return current.model_copy(update=changes)

    def delete(self, key: str) -> ModelRecord:
        """Remove the record (not its files) and return what it was."""
        with self._db.transaction() as cursor:
            record = self.get(key)
            cursor.execute("DELETE FROM models WHERE key = ?", (key,))
        return record
