"""The tensor store: what nodes pass between them by name, in memory under a byte cap."""

from __future__ import annotations

import pytest
import torch

from invokeai.app.services.tensors import TensorStore


def test_saves_and_loads_tensors_and_dicts_by_name() -> None:
    store = TensorStore()
    latents = torch.arange(6.0).reshape(2, 3)
    name = store.save(latents)
    assert len(name) == 32 and int(name, 16) >= 0
    assert torch.equal(store.load(name), latents)
    pair = {"embeds": torch.ones(2), "mask": torch.tensor([True, False])}
    loaded = store.load(store.save(pair))
    assert set(loaded) == {"embeds", "mask"} and torch.equal(loaded["mask"], pair["mask"])


def test_entries_are_copies() -> None:
    # A node that changes its input in place must not change what the next node loads, nor the saver's tensor.
    store = TensorStore()
    original = torch.zeros(3)
    name = store.save(original)
    original += 1
    first = store.load(name)
    first += 5
    assert torch.equal(store.load(name), torch.zeros(3))


def test_unknown_and_deleted_names_raise_key_error() -> None:
    store = TensorStore()
    name = store.save(torch.zeros(1))
    store.delete(name)
    with pytest.raises(KeyError, match="never saved, was deleted, or was dropped"):
        store.load(name)
    with pytest.raises(KeyError):
        store.delete(name)


def test_least_recently_used_entries_go_first_under_the_cap() -> None:
    store = TensorStore(max_bytes=3 * 400)  # three 100-float entries
    a, b, c = (store.save(torch.zeros(100)) for _ in range(3))
    store.load(a)  # a is now more recent than b
    d = store.save(torch.zeros(100))
    assert b not in store and all(name in store for name in (a, c, d))
    assert store.total_bytes == 1200


def test_refuses_what_cannot_be_stored() -> None:
    store = TensorStore(max_bytes=100)
    with pytest.raises(ValueError, match="does not fit"):
        store.save(torch.zeros(1000))
    with pytest.raises(TypeError):
        store.save([torch.zeros(1)])  # type: ignore[arg-type]


def test_delete_owned_deletes_that_owners_entries_only() -> None:
    store = TensorStore()
    first = store.save(torch.zeros(4), owner="session-a")
    second = store.save({"embeds": torch.ones(2)}, owner="session-a")
    other = store.save(torch.zeros(8), owner="session-b")
    unowned = store.save(torch.zeros(1))
    assert store.delete_owned("session-a") == 2
    assert first not in store and second not in store
    assert other in store and unowned in store
    assert store.total_bytes == (8 + 1) * 4
    assert store.delete_owned("session-a") == 0


def test_delete_owned_skips_entries_already_gone() -> None:
    store = TensorStore(max_bytes=16)
    evicted = store.save(torch.zeros(4), owner="s")  # 16 bytes: the next save drops it
    kept = store.save(torch.zeros(2), owner="s")
    assert evicted not in store
    assert store.delete_owned("s") == 1 and kept not in store and store.total_bytes == 0
