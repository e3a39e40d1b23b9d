"""ClientStateService on both engines: values by key, prefixes, deletes, and its bounds."""

from __future__ import annotations

import pytest
from engine_support import ENGINES

from invokeai.app.services.client_state import ClientStateFullError, ClientStateService, ClientStateValueTooLargeError
from invokeai.app.services.database import Database


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_values_are_set_read_replaced_and_deleted_by_key(db: Database) -> None:
    state = ClientStateService(db)
    assert state.get("gallery") is None
    assert state.set("gallery", '{"a": 1}') == '{"a": 1}'
    assert state.set("gallery", '{"a": 2}') == '{"a": 2}'
    state.set("Gallery_x", "x")
    state.set("params", "p")
    assert state.get("gallery") == '{"a": 2}'
    # Literally and case and all (the engines' LIKE differ on case; _ is no wildcard).
    assert state.keys_by_prefix("gallery") == ["gallery"]
    assert state.keys_by_prefix("G") == ["Gallery_x"]
    assert sorted(state.keys_by_prefix("")) == ["Gallery_x", "gallery", "params"]
    state.delete("gallery")
    state.delete("never-set")
    assert state.get("gallery") is None
    state.delete_all()
    assert state.keys_by_prefix("") == []


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_the_number_of_keys_and_the_value_size_are_bounded(db: Database) -> None:
    state = ClientStateService(db, max_keys=2, max_value_length=10)
    state.set("a", "1")
    state.set("b", "2")
    with pytest.raises(ClientStateFullError, match="2 keys"):
        state.set("c", "3")
    assert state.set("a", "replaced") == "replaced"  # a known key may still change
    with pytest.raises(ClientStateValueTooLargeError, match="at most 10"):
        state.set("a", "x" * 11)
    with pytest.raises(ValueError, match="at most 255"):
        state.set("k" * 256, "1")
    assert state.get("c") is None and state.get("a") == "replaced"
