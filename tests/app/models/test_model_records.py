"""Model records in SQLite: add, find by key or name, list, rename, delete; and ModelIdentifier."""

from __future__ import annotations

import pytest
from engine_support import ENGINES
from pydantic import ValidationError

from invokeai.app.services.database import Database
from invokeai.app.services.model_records import (
    DuplicateModelNameError,
    InvalidModelNameError,
    ModelIdentifier,
    ModelNotFoundError,
    ModelRecord,
    ModelRecordService,
)


def record(key: str, name: str, family: str = "sd-1", type: str = "main") -> ModelRecord:
    return ModelRecord(
        key=key,
        name=name,
        family=family,  # type: ignore[arg-type]
        type=type,
        format="diffusers",
        path=f"/models/{name}",
        size=10,
        hash=None,
        source=f"/src/{name}",
        description=None,
        config_variant=None,
    )


@pytest.fixture
def records(db: Database) -> ModelRecordService:
    return ModelRecordService(db)


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_add_then_find_by_key_and_by_name(records: ModelRecordService) -> None:
    added = records.add(record("k1", "Alpha"))
    assert records.get("k1") == added
    assert records.get_by_name("alpha") == added  # names match case-insensitively
    assert records.count() == 1


def test_unknown_key_or_name_says_which(records: ModelRecordService) -> None:
    with pytest.raises(ModelNotFoundError, match="no model with key 'nope'"):
        records.get("nope")
    with pytest.raises(ModelNotFoundError, match="no model named 'nope'"):
        records.get_by_name("nope")


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_names_are_unique_case_insensitively(records: ModelRecordService) -> None:
    records.add(record("k1", "demo"))
    with pytest.raises(DuplicateModelNameError, match="'DEMO' already exists"):
        records.add(record("k2", "DEMO"))
    assert records.count() == 1


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden", "trailing.", "x" * 101])
def test_unsafe_names_are_refused(records: ModelRecordService, name: str) -> None:
    with pytest.raises(InvalidModelNameError):
        records.add(record("k", name))


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_list_is_by_name_and_filters(records: ModelRecordService) -> None:
    records.add(record("k1", "b-krea", family="krea2"))
    records.add(record("k2", "a-sd", family="sd-1"))
    records.add(record("k3", "c-gguf", family="krea2", type="transformer"))
    assert [r.name for r in records.list()] == ["a-sd", "b-krea", "c-gguf"]
    assert [r.name for r in records.list(family="krea2")] == ["b-krea", "c-gguf"]
    assert [r.name for r in records.list(family="krea2", type="main")] == ["b-krea"]


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_update_renames_and_describes(records: ModelRecordService) -> None:
    records.add(record("k1", "old"))
    records.add(record("k2", "taken"))
    updated = records.update("k1", {"name": "new", "description": "described"})
    assert (updated.name, updated.description) == ("new", "described")
    assert records.get_by_name("new") == updated
    with pytest.raises(DuplicateModelNameError):
        records.update("k1", {"name": "TAKEN"})
    with pytest.raises(ValueError, match="cannot change path"):
        records.update("k1", {"path": "/elsewhere"})
    with pytest.raises(ModelNotFoundError):
        records.update("missing", {"description": "x"})
    assert records.get("k1") == updated


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_delete_returns_the_record_and_forgets_it(records: ModelRecordService) -> None:
    added = records.add(record("k1", "gone"), owned=True)
    assert records.is_owned("k1")
    assert records.delete("k1") == added
    with pytest.raises(ModelNotFoundError):
        records.get("k1")
    with pytest.raises(ModelNotFoundError):
        records.delete("k1")


def test_identifier_names_a_model_by_key_else_by_name() -> None:
    assert ModelIdentifier(key="k").token == "key:k"
    assert ModelIdentifier.model_validate({"name": "Demo-SD1"}).token == "name:demo-sd1"
    # InvokeAI's ModelIdentifierField: every part set; the key is what names the model.
    invokeai = {"key": "k", "hash": "blake3:00", "name": "n", "base": "sd-1", "type": "main", "submodel_type": None}
    assert ModelIdentifier.model_validate(invokeai).token == "key:k"
    with pytest.raises(ValidationError, match="neither is given"):
        ModelIdentifier.model_validate({"hash": "blake3:00", "base": "sd-1"})


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_trigger_phrases_default_settings_and_source_type_are_kept(records: ModelRecordService) -> None:
    added = records.add(
        record("k1", "tuned").model_copy(update={"trigger_phrases": ["sks", "é ☃"], "default_settings": {"steps": 8}})
    )
    assert records.get("k1") == added and added.source_type == "path"
    changed = records.update("k1", {"trigger_phrases": None, "default_settings": {"width": 768, "cfg_scale": 5.5}})
    assert (changed.trigger_phrases, changed.default_settings) == (None, {"width": 768, "cfg_scale": 5.5})
    assert records.get("k1") == changed
