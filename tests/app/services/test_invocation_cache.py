"""The invocation cache on its own, with a real tensor store: keys, bounds, and the lifetimes of the tensors that
cached outputs name."""

from __future__ import annotations

import pytest
import torch
from engine_support import ENGINES

from invokeai.app.nodes.base import ImageField
from invokeai.app.nodes.image import ImageOutput
from invokeai.app.nodes.model_fields import LatentsField, LatentsOutput
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput, StringInvocation
from invokeai.app.services.database import Database
from invokeai.app.services.invocation_cache import InvocationCache, cache_key, models_version_of
from invokeai.app.services.tensors import TensorStore


def latents_output(store: TensorStore, owner: str, floats: int = 4) -> tuple[LatentsOutput, str]:
    name = store.save(torch.zeros(floats), owner=owner)
    return LatentsOutput(latents=LatentsField(latents_name=name), width=8, height=8), name


def test_the_key_is_the_type_and_the_inputs_not_the_id_or_the_flags() -> None:
    key = cache_key(IntegerInvocation(id="a", value=3))
    assert cache_key(IntegerInvocation(id="b", value=3, is_intermediate=True, use_cache=False)) == key
    assert cache_key(IntegerInvocation(id="a", value=4)) != key
    assert cache_key(StringInvocation(id="a", value="3")) != key


def test_a_hit_is_a_copy_and_is_counted() -> None:
    cache = InvocationCache(4)
    assert cache.get("k") is None
    assert cache.save("k", IntegerOutput(value=7))
    first = cache.get("k")
    assert first == IntegerOutput(value=7)
    first.value = 8  # type: ignore[union-attr]
    assert cache.get("k") == IntegerOutput(value=7)
    status = cache.status()
    assert (status.hits, status.misses, status.size, status.max_size, status.enabled) == (2, 1, 1, 4, True)


def test_the_least_recently_used_output_goes_past_max_size() -> None:
    cache = InvocationCache(2)
    for key in "abc":
        cache.save(key, IntegerOutput(value=ord(key)))
        if key == "b":
            cache.get("a")  # a is now more recent than b
    assert cache.status().size == 2
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None


def test_outputs_that_hold_an_image_are_never_kept() -> None:
    cache = InvocationCache(4)
    image = ImageOutput(image=ImageField(image_name="x.png"), width=1, height=1)
    assert not cache.save("k", image)
    assert cache.get("k") is None and cache.status().size == 0


def test_size_0_turns_it_off_and_disable_keeps_what_it_holds() -> None:
    off = InvocationCache(0)
    assert not off.save("k", IntegerOutput(value=1)) and off.get("k") is None
    off.enable()
    assert off.status().enabled is False and off.status().misses == 0
    cache = InvocationCache(4)
    cache.save("k", IntegerOutput(value=1))
    cache.disable()
    assert not cache.active and cache.get("k") is None and not cache.save("j", IntegerOutput(value=2))
    cache.enable()
    assert cache.get("k") == IntegerOutput(value=1)
    cache.clear()
    assert cache.status().model_dump() == {
        "size": 0,
        "hits": 0,
        "misses": 0,
        "enabled": True,
        "max_size": 4,
        "pinned_bytes": 0,
    }


def test_a_cached_output_keeps_its_tensors_after_their_session_ends() -> None:
    store = TensorStore()
    cache = InvocationCache(4, store)
    output, name = latents_output(store, "session-1")
    assert cache.save("k", output)
    assert store.delete_owned("session-1") == 0  # the item ended: its pinned tensor stays
    hit = cache.get("k", holder="session-2")
    assert hit == output and torch.equal(store.load(name), torch.zeros(4))
    assert cache.status().pinned_bytes == 16
    cache.clear()  # the cache lets go, but session 2 still holds it until its item ends
    assert name in store
    assert store.delete_owned("session-2") == 1 and name not in store and store.total_bytes == 0


def test_an_evicted_output_deletes_the_tensors_nothing_else_holds() -> None:
    store = TensorStore()
    cache = InvocationCache(1, store)
    first, first_name = latents_output(store, "s1")
    cache.save("a", first)
    store.delete_owned("s1")
    second, second_name = latents_output(store, "s2")
    cache.save("b", second)  # evicts a
    assert first_name not in store and second_name in store
    assert cache.status().pinned_bytes == 16


def test_pinned_tensors_are_never_dropped_to_make_room_and_are_bounded_by_bytes() -> None:
    store = TensorStore(max_bytes=10 * 400)  # ten 100-float entries
    cache = InvocationCache(100, store)  # pins at most half the store: five entries
    names = []
    for index in range(6):
        output, name = latents_output(store, f"s{index}", floats=100)
        cache.save(f"k{index}", output)
        store.delete_owned(f"s{index}")  # its item ended
        names.append(name)
    assert store.pinned_bytes <= store.max_bytes // 2
    assert names[0] not in store and all(name in store for name in names[1:])  # the oldest output went first
    for _ in range(20):  # unpinned saves fill the rest of the store over and over
        store.save(torch.zeros(100), owner="busy")
    assert all(name in store for name in names[1:])
    assert all(cache.get(f"k{index}") is not None for index in range(1, 6))


def test_a_save_that_finds_only_pinned_tensors_in_its_way_drops_cached_outputs() -> None:
    store = TensorStore(max_bytes=10 * 400)
    cache = InvocationCache(100, store)
    pinned = []
    for index in range(5):
        output, name = latents_output(store, f"s{index}", floats=100)
        cache.save(f"k{index}", output)
        store.delete_owned(f"s{index}")
        pinned.append(name)
    big = store.save(torch.zeros(800))  # 3200 bytes: fits only once three pinned entries are gone
    assert big in store and store.total_bytes <= store.max_bytes
    assert [name in store for name in pinned] == [False, False, False, True, True]
    assert cache.status().size == 2


def test_a_change_of_the_model_records_empties_the_cache() -> None:
    version = ["v1"]
    cache = InvocationCache(4, models_version=lambda: version[0])
    cache.check_models()
    cache.save("k", IntegerOutput(value=1))
    cache.check_models()
    assert cache.get("k") is not None
    version[0] = "v2"
    cache.check_models()
    assert cache.get("k") is None and cache.status().size == 0


@pytest.mark.parametrize("db", ENGINES, indirect=True)
def test_the_model_records_version_changes_with_an_install_a_rename_and_a_removal(db: Database) -> None:
    version = models_version_of(db)
    empty = version()
    with db.transaction() as cursor:  # the columns of migration 3; later ones have defaults
        cursor.execute(
            "INSERT INTO models (key, name, family, type, format, path, size, source, created_at, updated_at) "
            "VALUES ('k1', 'one', 'sd-1', 'main', 'diffusers', '/m', 1, '/m', 't0', 't0')"
        )
    installed = version()
    assert installed != empty and version() == installed
    with db.transaction() as cursor:
        cursor.execute("UPDATE models SET name = 'two', updated_at = 't1' WHERE key = 'k1'")
    renamed = version()
    assert renamed not in (empty, installed)
    with db.transaction() as cursor:
        cursor.execute("DELETE FROM models WHERE key = 'k1'")
    assert version() == empty
