"""ModelCache on the CPU: LRU by size in RAM, hits and misses, reservations with the floor, models larger than the
cache, models in use; device offloading with the CPU standing in for a GPU (module-level device queries replaced),
and on a real CUDA device where there is one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from invokeai.backend.cache import model_cache
from invokeai.backend.cache.model_cache import ModelCache, model_bytes

CPU = torch.device("cpu")
LINEAR_BYTES = (64 * 64 + 64) * 4  # nn.Linear(64, 64) in fp32: weight and bias


def linear_loader(calls: list[str], key: str) -> Callable[[], nn.Module]:
    def load() -> nn.Module:
        calls.append(key)
        return nn.Linear(64, 64)

    return load


def resident(cache: ModelCache) -> list[str]:
    return [entry["key"] for entry in cache.stats()["resident"]]


def test_model_size_is_parameter_and_buffer_bytes() -> None:
    model = nn.BatchNorm1d(10)  # 2 x 10 parameters, 2 x 10 float buffers and one int64 counter
    assert model_bytes(model) == 20 * 4 + 20 * 4 + 8
    assert model_bytes(nn.Linear(64, 64)) == LINEAR_BYTES


def test_least_recently_used_is_evicted_first_until_the_new_model_fits() -> None:
    cache = ModelCache(int(2.5 * LINEAR_BYTES), CPU, 0)
    calls: list[str] = []
    for key in ("a", "b", "a", "c"):
        cache.load(key, linear_loader(calls, key))
    assert resident(cache) == ["a", "c"]  # b was least recently used once "a" was used again
    cache.load("d", linear_loader(calls, "d"))
    assert resident(cache) == ["c", "d"]
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (1, 4, 2)
    assert stats["resident_bytes"] == 2 * LINEAR_BYTES <= stats["max_cache_ram_bytes"]
    assert calls == ["a", "b", "c", "d"]


def test_eviction_frees_as_many_models_as_the_new_one_needs() -> None:
    cache = ModelCache(3 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    for key in ("a", "b", "c"):
        cache.load(key, linear_loader(calls, key))
    cache.load("wide", lambda: nn.Linear(64, 128))  # twice a Linear(64, 64) and a bit
    assert resident(cache) == ["c", "wide"]
    assert cache.stats()["evictions"] == 2


def test_a_hit_returns_the_same_object_without_loading() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    first = cache.load("a", linear_loader(calls, "a"))
    assert cache.load("a", linear_loader(calls, "a")) is first
    assert calls == ["a"]
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (1, 1)


def test_a_model_larger_than_the_cache_is_loaded_but_not_kept() -> None:
    cache = ModelCache(LINEAR_BYTES // 2, CPU, 0)
    calls: list[str] = []
    model = cache.load("big", linear_loader(calls, "big"))
    assert isinstance(model, nn.Linear)
    assert resident(cache) == []
    cache.load("big", linear_loader(calls, "big"))
    assert calls == ["big", "big"]
    assert cache.stats()["evictions"] == 0
    with cache.on_device("big", linear_loader(calls, "big"), 10) as on_device:
        assert isinstance(on_device, nn.Linear)


def test_the_reservation_is_the_estimate_or_the_floor_whichever_is_larger() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, device_working_mem_bytes=1000)
    calls: list[str] = []
    with cache.on_device("a", linear_loader(calls, "a"), 10):
        reservation = cache.stats()["last_reservation"]
    assert reservation == {
        "key": "a",
        "device": "cpu",
        "working_memory_bytes": 10,
        "floor_bytes": 1000,
        "reserved_bytes": 1000,
        "short_bytes": 0,
    }
    with cache.on_device("a", linear_loader(calls, "a"), 5000):
        assert cache.stats()["last_reservation"]["reserved_bytes"] == 5000
    assert calls == ["a"]


def test_on_the_cpu_the_model_is_returned_where_it_is() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    model = nn.Linear(64, 64)
    weight = model.weight
    with cache.on_device("a", lambda: model, 0) as on_device:
        assert on_device is model and on_device.weight is weight


def test_a_model_in_use_is_not_evicted() -> None:
    cache = ModelCache(2 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    with cache.on_device("a", linear_loader(calls, "a"), 0):
        cache.load("b", linear_loader(calls, "b"))
        cache.load("c", linear_loader(calls, "c"))
        assert "a" in resident(cache)
        assert [e["in_use"] for e in cache.stats()["resident"] if e["key"] == "a"] == [True]
    assert resident(cache) == ["a", "c"]


def test_drop_removes_the_models_under_a_prefix_at_once() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    for key in ("m1:unet", "m1:vae", "m10:vae", "m2:vae"):
        cache.load(key, linear_loader(calls, key))
    assert cache.drop("m1:") == 2
    assert resident(cache) == ["m10:vae", "m2:vae"]
    cache.load("m1:vae", linear_loader(calls, "m1:vae"))
    assert calls.count("m1:vae") == 2  # loaded again: nothing of the dropped model was kept


def test_a_model_dropped_while_in_use_leaves_when_released() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    with cache.on_device("m1:unet", linear_loader(calls, "m1:unet"), 0) as model:
        assert cache.drop("m1:") == 0
        assert resident(cache) == ["m1:unet"]  # the running node keeps its model
        assert isinstance(model, nn.Linear)
    assert resident(cache) == []


def test_concurrent_loads_of_one_key_load_it_once() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    barrier = threading.Barrier(4)
    models: list[nn.Module] = []

    def worker() -> None:
        barrier.wait()
        for _ in range(25):
            models.append(cache.load("a", linear_loader(calls, "a")))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["a"]
    assert len({id(m) for m in models}) == 1
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (99, 1)


def test_a_read_in_progress_holds_up_only_the_threads_that_need_that_model() -> None:
    # The warm-up reads a model in the background while a worker claims an item (the claim reads the cache's stats)
    # and its first node loads another model: neither may wait for that read.
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    reading, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow_a() -> nn.Module:
        calls.append("a")
        reading.set()
        assert release.wait(30)
        return nn.Linear(64, 64)

    got: dict[str, nn.Module] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", cache.load("a", slow_a)))
    first.start()
    assert reading.wait(30)
    second = threading.Thread(target=lambda: got.setdefault("second", cache.load("a", linear_loader(calls, "a"))))
    second.start()
    other = threading.Thread(target=lambda: got.setdefault("b", cache.load("b", linear_loader(calls, "b"))))
    other.start()
    other.join(10)
    assert not other.is_alive() and cache.holds("b") and resident(cache) == ["b"]
    second.join(0.2)
    assert second.is_alive()  # it needs "a": it waits for the read in progress rather than reading again
    release.set()
    first.join(10)
    second.join(10)
    assert got["first"] is got["second"] and calls == ["a", "b"]
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (1, 2)


def test_a_failed_read_is_tried_again_by_the_next_load() -> None:
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)

    def broken() -> nn.Module:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        cache.load("a", broken)
    calls: list[str] = []
    assert isinstance(cache.load("a", linear_loader(calls, "a")), nn.Linear) and calls == ["a"]


class StandInDevice:
    """A GPU of `capacity` bytes whose only tenants are the cache's models flagged as on the device."""

    def __init__(self, cache_ref: list[ModelCache], capacity: int) -> None:
        self.cache_ref = cache_ref
        self.capacity = capacity
        self.released = 0

    def free(self, device: torch.device) -> int:
        stats = self.cache_ref[0].stats()
        return self.capacity - sum(e["size"] for e in stats["resident"] if e["on_device"])

    def release(self, device: torch.device) -> None:
        self.released += 1


StandInFactory = Callable[[int, int], tuple[ModelCache, StandInDevice]]


@pytest.fixture
def stand_in_gpu(monkeypatch: pytest.MonkeyPatch) -> StandInFactory:
    def make(capacity: int, floor: int) -> tuple[ModelCache, StandInDevice]:
        ref: list[ModelCache] = []
        device = StandInDevice(ref, capacity)
        monkeypatch.setattr(model_cache, "reserves_device_memory", lambda d: True)
        monkeypatch.setattr(model_cache, "device_free_bytes", device.free)
        monkeypatch.setattr(model_cache, "release_cached_blocks", device.release)
        ref.append(ModelCache(100 * LINEAR_BYTES, CPU, floor))
        return ref[0], device

    return make


def on_device_keys(cache: ModelCache) -> list[str]:
    return [e["key"] for e in cache.stats()["resident"] if e["on_device"]]


def test_a_reservation_offloads_the_least_recently_used_models_first(stand_in_gpu: StandInFactory) -> None:
    cache, device = stand_in_gpu(4 * LINEAR_BYTES, LINEAR_BYTES // 2)
    calls: list[str] = []
    for key in ("a", "b", "c"):
        with cache.on_device(key, linear_loader(calls, key), 0):
            pass
    assert on_device_keys(cache) == ["a", "b", "c"]
    # d needs its own size plus 1.5 models of working memory: a and b (least recently used) make room, c stays.
    with cache.on_device("d", linear_loader(calls, "d"), int(1.5 * LINEAR_BYTES)):
        assert on_device_keys(cache) == ["c", "d"]
    stats = cache.stats()
    assert stats["offloads"] == 2 and device.released == 2
    assert stats["last_reservation"]["short_bytes"] == 0


def test_the_floor_reserves_when_the_estimate_is_smaller(stand_in_gpu: StandInFactory) -> None:
    cache, _ = stand_in_gpu(3 * LINEAR_BYTES, 2 * LINEAR_BYTES)
    calls: list[str] = []
    with cache.on_device("a", linear_loader(calls, "a"), 0):
        pass
    with cache.on_device("b", linear_loader(calls, "b"), 1):
        assert on_device_keys(cache) == ["b"]  # b plus a floor of two models leaves no room for a


def test_a_model_already_on_the_device_only_reserves_its_working_memory(stand_in_gpu: StandInFactory) -> None:
    cache, _ = stand_in_gpu(3 * LINEAR_BYTES, 0)
    calls: list[str] = []
    for key in ("a", "b", "a"):
        with cache.on_device(key, linear_loader(calls, key), 0):
            pass
    with cache.on_device("a", linear_loader(calls, "a"), LINEAR_BYTES):
        assert on_device_keys(cache) == ["b", "a"]
    assert cache.stats()["offloads"] == 0


def test_models_in_use_are_not_offloaded_and_a_short_reservation_is_reported(stand_in_gpu: StandInFactory) -> None:
    cache, _ = stand_in_gpu(2 * LINEAR_BYTES, 0)
    calls: list[str] = []
    with cache.on_device("a", linear_loader(calls, "a"), 0):
        with cache.on_device("b", linear_loader(calls, "b"), LINEAR_BYTES):
            assert on_device_keys(cache) == ["a", "b"]
            assert cache.stats()["last_reservation"]["short_bytes"] == LINEAR_BYTES
    assert cache.stats()["offloads"] == 0


def test_demo_components_are_cached_by_size_and_reserved_with_their_estimate(demo_root: Path) -> None:
    from invokeai.backend.cache.working_memory import CallFacts, estimate_working_memory
    from invokeai.backend.models.loaders import load_component
    from invokeai.backend.models.probe import probe_model

    sd1 = probe_model(demo_root / "demo-sd1")
    loaders = {name: (lambda name=name: load_component(sd1, name)) for name in ("text_encoder", "unet", "vae")}
    sizes = {name: model_bytes(loader()) for name, loader in loaders.items()}
    # Room for the UNet and one small component: loading all three evicts the least recently used.
    cache = ModelCache(sizes["unet"] + max(sizes["text_encoder"], sizes["vae"]), CPU, 1024)
    cache.load("text_encoder", loaders["text_encoder"])
    unet_config = cache.load("unet", loaders["unet"]).config
    facts = CallFacts(CPU, torch.float32, width=64, height=64)
    estimate = estimate_working_memory("sd-1", "unet", unet_config, facts).total(CPU, torch.float32)
    with cache.on_device("unet", loaders["unet"], estimate) as unet:
        assert unet.config == unet_config
        cache.load("vae", loaders["vae"])
    stats = cache.stats()
    assert resident(cache) == ["unet", "vae"]
    assert {e["key"]: e["size"] for e in stats["resident"]} == {"unet": sizes["unet"], "vae": sizes["vae"]}
    assert stats["last_reservation"]["reserved_bytes"] == max(estimate, 1024) > 1024
    assert (stats["hits"], stats["misses"], stats["evictions"]) == (1, 3, 1)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
def test_cuda_models_move_to_the_device_and_are_offloaded_for_a_reservation() -> None:
    big = 256 * 2**20  # a 256 MiB model
    cache = ModelCache(8 * big, torch.device("cuda"), 0)

    def loader() -> nn.Module:
        return nn.Linear(big // 4 // 1024, 1024, bias=False)

    with cache.on_device("a", loader, 0) as a:
        assert a.weight.is_cuda
    with cache.on_device("b", loader, 0) as b:
        assert b.weight.is_cuda
    # Ask for all but a little of what is free now: "a", least recently used, must go back to the CPU first.
    want = torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    with cache.on_device("b", loader, want + big // 2):
        keys = {e["key"]: e["on_device"] for e in cache.stats()["resident"]}
        assert keys == {"a": False, "b": True}
        assert cache.load("a", loader).weight.device.type == "cpu"
    assert cache.stats()["offloads"] == 1


@pytest.mark.cuda
@cuda
def test_cuda_an_unsatisfiable_reservation_is_reported_short_and_the_model_still_runs() -> None:
    cache = ModelCache(2**30, torch.device("cuda"), 0)
    total = torch.cuda.mem_get_info()[1]
    with cache.on_device("a", lambda: nn.Linear(16, 16), 2 * total) as a:
        assert a.weight.is_cuda
        assert cache.stats()["last_reservation"]["short_bytes"] > total


def test_a_device_copy_leaves_the_ram_copy_where_it_is() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    copy = model_cache.device_copy(model, torch.device("meta"))
    assert {t.device.type for t in (*copy.parameters(), *copy.buffers())} == {"meta"}
    assert {t.device.type for t in (*model.parameters(), *model.buffers())} == {"cpu"}
    assert isinstance(copy[0].weight, nn.Parameter) and copy[0].weight.requires_grad


def test_two_workers_share_one_ram_copy_loaded_once() -> None:
    """Two CPU workers asking for one model at once: it is read once, and on the CPU both run the RAM copy."""
    cache = ModelCache(10 * LINEAR_BYTES, CPU, 0)
    calls: list[str] = []
    barrier = threading.Barrier(2)
    got: list[nn.Module] = []

    def worker() -> None:
        barrier.wait()
        with cache.on_device("a", linear_loader(calls, "a"), 0, CPU) as model:
            got.append(model)
            barrier.wait()  # both hold it at once: a model in use by one worker is there for the other

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert calls == ["a"]
    assert got[0] is got[1] is cache.load("a", linear_loader(calls, "a"))


def test_an_offload_from_one_device_leaves_the_other_devices_copy(stand_in_gpu: StandInFactory) -> None:
    """Copies per device: a reservation on one device drops that device's copy only."""
    cache, _ = stand_in_gpu(2 * LINEAR_BYTES, 0)
    other = torch.device("meta")  # a second device, whose copy is a real copy
    calls: list[str] = []
    with cache.on_device("a", linear_loader(calls, "a"), 0, other) as on_other:
        assert on_other.weight.device.type == "meta"
    with cache.on_device("a", linear_loader(calls, "a"), 0):
        pass
    with cache.on_device("b", linear_loader(calls, "b"), LINEAR_BYTES):
        assert on_device_keys(cache) == ["b"]  # "a" left the execution device...
    assert [e["key"] for e in cache.stats(other)["resident"] if e["on_device"]] == ["a"]  # ...not the other one
    assert cache.load("a", linear_loader(calls, "a")).weight.device.type == "cpu"
    assert calls == ["a", "b"]


@pytest.mark.cuda
@cuda
def test_cuda_each_gpu_gets_its_own_copy_and_the_ram_copy_stays() -> None:
    cache = ModelCache(2**30, torch.device("cuda", 0), 0)
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    for device in devices:
        with cache.on_device("a", lambda: nn.Linear(16, 16), 0, device) as model:
            assert model.weight.device == device
    assert cache.load("a", lambda: nn.Linear(16, 16)).weight.device.type == "cpu"
    assert cache.stats()["misses"] == 1
