"""The model manager: identifiers resolved to records, components loaded once and held on the device, the pipeline
a lone GGUF transformer borrows from; and the processor handing the manager and tensor store to nodes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from model_test_support import installed

from invokeai.app.nodes.base import InvocationContext
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput
from invokeai.app.services.container import Services
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelIdentifier, ModelNotFoundError
from invokeai.backend.families.registry import FAMILIES


def services_of(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def manager(client: TestClient, built_models: dict[str, Path]) -> ModelManager:
    # Every registered family's demo models (a family's companions are chosen among its own models only).
    for demo in (demo for family in FAMILIES for demo in family.demos):
        installed(client, built_models[demo.name], inplace=True)
    return services_of(client).models


def test_resolves_by_key_or_name_and_says_what_is_missing(manager: ModelManager) -> None:
    by_name = manager.resolve(ModelIdentifier(name="demo-sd1"))
    assert manager.resolve(ModelIdentifier(key=by_name.key)) == by_name
    with pytest.raises(ModelNotFoundError, match="no model named 'demo-nothing'"):
        manager.resolve(ModelIdentifier(name="demo-nothing"))
    with pytest.raises(ModelNotFoundError, match="no model with key 'k'"):
        manager.resolve(ModelIdentifier(key="k"))


def test_cpu_runs_float32() -> None:
    from invokeai.app.config import InvokeAIAppConfig
    from invokeai.app.services.container import build_model_manager
    from invokeai.app.services.model_records import ModelRecordService
    from invokeai.app.services.sqlite import SqliteDatabase

    config = InvokeAIAppConfig.located({"device": "cpu"}, Path("/nonexistent"), None)
    manager = build_model_manager(config, ModelRecordService(SqliteDatabase(None)))
    assert (manager.device, manager.dtype) == (torch.device("cpu"), torch.float32)


def test_components_load_once_and_go_on_device(manager: ModelManager) -> None:
    torch.set_num_threads(1)
    sd1 = manager.resolve(ModelIdentifier(name="demo-sd1"))
    assert manager.components(sd1) == ["text_encoder", "tokenizer", "unet", "vae", "scheduler"]
    vae = manager.load(sd1, "vae")
    assert isinstance(vae, torch.nn.Module) and manager.load(sd1, "vae") is vae
    tokenizer = manager.load(sd1, "tokenizer")
    assert manager.load(sd1, "tokenizer") is tokenizer
    with manager.on_device(sd1, "vae_decode", width=64, height=64) as module:
        assert module is vae
        assert next(module.parameters()).device.type == manager.device.type
        assert next(module.parameters()).dtype == manager.dtype


def test_on_device_reserves_the_family_estimate_for_the_operation(manager: ModelManager) -> None:
    from invokeai.backend.cache.working_memory import CallFacts, estimate_working_memory

    sd1 = manager.resolve(ModelIdentifier(name="demo-sd1"))
    # vae_decode and vae_encode run the same module but cost differently; the config is read from the files.
    facts = CallFacts(manager.device, manager.dtype, width=128, height=96)
    for operation in ("vae_decode", "vae_encode"):
        expected = estimate_working_memory("sd-1", operation, vae_config := manager.config(sd1, "vae"), facts)
        assert manager.working_memory(sd1, operation, width=128, height=96) == expected.total(facts.device, facts.dtype)
    assert vae_config["latent_channels"] == 4
    assert manager.working_memory(sd1, "vae_decode", width=128, height=96) != manager.working_memory(
        sd1, "vae_encode", width=128, height=96
    )
    with pytest.raises(KeyError, match="has no operation 'vae'; known: text_encoder, unet, vae_decode, vae_encode"):
        manager.working_memory(sd1, "vae")


def test_a_gguf_transformer_borrows_from_demo_krea2(manager: ModelManager, client: TestClient) -> None:
    gguf = manager.resolve(ModelIdentifier(name="demo-krea2-gguf"))
    assert manager.components(gguf) == ["transformer"]
    assert manager.companion(gguf, "vae").name == "demo-krea2"
    demo = manager.resolve(ModelIdentifier(name="demo-krea2"))
    manager.records.update(demo.key, {"name": "zz-krea2"})
    other = manager.records.add(demo.model_copy(update={"key": "k2", "name": "aa-krea2"}))
    assert manager.companion(gguf, "text_encoder") == other  # no demo-krea2: the first by name
    for record in manager.records.list(family="krea2", type="main"):
        manager.records.delete(record.key)
    with pytest.raises(ModelNotFoundError, match="no krea2 pipeline"):
        manager.companion(gguf, "vae")


def test_a_lone_transformer_pairs_only_with_a_pipeline_of_its_architecture(
    manager: ModelManager, tmp_path: Path
) -> None:
    import json

    from invokeai.backend.families import config_variant

    # A full-size Krea-2 pipeline, as far as pairing looks (its transformer config); its name sorts first.
    full_size = tmp_path / "krea2-full"
    (full_size / "transformer").mkdir(parents=True)
    config = config_variant("krea2").component_config("transformer")
    (full_size / "transformer" / "config.json").write_text(json.dumps(config), encoding="utf-8")
    demo = manager.resolve(ModelIdentifier(name="demo-krea2"))
    full = manager.records.add(demo.model_copy(update={"key": "full", "name": "aa-krea2-full", "path": str(full_size)}))
    tiny_gguf = manager.resolve(ModelIdentifier(name="demo-krea2-gguf"))
    assert manager.companion(tiny_gguf, "vae").name == "demo-krea2"  # not the full-size pipeline, first by name
    full_gguf = manager.records.add(
        tiny_gguf.model_copy(update={"key": "full-gguf", "name": "krea2-full-q8", "config_variant": "krea2"})
    )
    assert manager.companion(full_gguf, "text_encoder") == full
    manager.records.delete(full.key)
    with pytest.raises(
        ModelNotFoundError, match=r"no installed krea2 pipeline was made for its transformer \(installed: demo-krea2\)"
    ):
        manager.companion(full_gguf, "vae")


def test_a_published_config_pairs_with_a_saved_one_listing_every_default(
    client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    """FLUX.1 dev's published transformer config leaves out arguments at their defaults (out_channels,
    axes_dims_rope); a pipeline folder diffusers saved lists every one. Both are the same architecture, so a lone dev
    transformer (configured from the shipped, published config) pairs with such a folder."""
    import json

    from accelerate import init_empty_weights
    from diffusers import FluxTransformer2DModel

    from invokeai.backend.families import config_variant

    for name in ("demo-flux", "demo-flux-gguf"):
        installed(client, built_models[name], inplace=True)
    manager = services_of(client).models
    published = config_variant("flux").component_config("transformer")
    assert "axes_dims_rope" not in published
    saved = tmp_path / "flux-dev-saved"
    (saved / "transformer").mkdir(parents=True)
    # What save_pretrained writes: the config with every init argument (register_to_config fills the defaults).
    with init_empty_weights():
        full = dict(FluxTransformer2DModel.from_config(published).config)
    assert full["axes_dims_rope"] == (16, 56, 56)
    (saved / "transformer" / "config.json").write_text(json.dumps(full), encoding="utf-8")
    (saved / "model_index.json").write_text(
        json.dumps({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]}),
        encoding="utf-8",
    )
    demo = manager.resolve(ModelIdentifier(name="demo-flux"))
    pipeline = manager.records.add(demo.model_copy(update={"key": "dev", "name": "aa-flux-dev", "path": str(saved)}))
    gguf = manager.resolve(ModelIdentifier(name="demo-flux-gguf"))
    lone = manager.records.add(
        gguf.model_copy(update={"key": "dev-q8", "name": "flux-dev-q8", "config_variant": "flux"})
    )
    assert manager.companion(lone, "vae") == pipeline
    assert manager.companion(gguf, "vae").name == "demo-flux"  # the demo transformer still pairs with its own


def test_a_lone_text_encoder_takes_the_tokenizer_of_a_pipeline_of_its_architecture(
    manager: ModelManager, client: TestClient, built_models: dict[str, Path], tmp_path: Path
) -> None:
    """A Qwen3 text encoder file (ComfyUI's) holds no tokenizer: it pairs with the Z-Image pipeline whose text
    encoder has its architecture, also when that pipeline's config.json was written by another transformers version
    (rope_theta, torch_dtype, the causal-LM class) than the shipped config the file is read with."""
    import json

    from transformers import Qwen3Model

    from invokeai.backend.families import config_variant
    from invokeai.backend.models import qwen3_encoder_file

    path = tmp_path / "qwen_3_4b-demo.safetensors"
    qwen3_encoder_file.write_comfyui_text_encoder(
        Qwen3Model.from_pretrained(built_models["demo-zimage"], subfolder="text_encoder"), path
    )
    encoder = manager.records.get(installed(client, path, name="qwen3-demo", inplace=True)["key"])
    assert (encoder.family, encoder.type, encoder.format) == ("z-image", "qwen3_encoder", "checkpoint")
    assert manager.components(encoder) == ["text_encoder"]
    assert manager.companion(encoder, "tokenizer").name == "demo-zimage"
    # A full-size pipeline, as far as pairing looks (its text encoder's config as Z-Image-Turbo publishes it); its
    # name sorts first, and the tiny encoder still pairs with the demo.
    published = dict(config_variant("z-image").component_config("text_encoder"))
    published |= {"rope_theta": 1000000, "torch_dtype": "bfloat16", "transformers_version": "4.51.0"}
    published |= {"architectures": ["Qwen3ForCausalLM"], "rope_scaling": None}
    del published["rope_parameters"], published["dtype"]
    folder = tmp_path / "z-image-turbo"
    (folder / "text_encoder").mkdir(parents=True)
    (folder / "text_encoder" / "config.json").write_text(json.dumps(published), encoding="utf-8")
    demo = manager.resolve(ModelIdentifier(name="demo-zimage"))
    turbo = manager.records.add(demo.model_copy(update={"key": "turbo", "name": "aa-turbo", "path": str(folder)}))
    assert manager.companion(encoder, "tokenizer").name == "demo-zimage"
    full = manager.records.add(
        encoder.model_copy(update={"key": "qwen3-4b", "name": "qwen3-4b", "config_variant": "z-image"})
    )
    assert manager.companion(full, "tokenizer") == turbo
    manager.records.delete(turbo.key)
    with pytest.raises(ModelNotFoundError, match=r"no installed z-image pipeline was made for its text_encoder"):
        manager.companion(full, "tokenizer")


def test_deleting_a_model_drops_what_was_loaded(manager: ModelManager, client: TestClient) -> None:
    sd1 = manager.resolve(ModelIdentifier(name="demo-sd1"))
    krea2 = manager.resolve(ModelIdentifier(name="demo-krea2"))
    tokenizer = manager.load(sd1, "tokenizer")
    manager.load(sd1, "vae")
    manager.load(krea2, "vae")
    assert client.delete(f"/api/v2/models/i/{sd1.key}").status_code == 204
    # Its modules leave the cache at once (their RAM is freed now, not when they would be least recently used).
    assert [entry["key"] for entry in manager.cache.stats()["resident"]] == [f"{krea2.key}:vae"]
    record = manager.records.get(installed(client, Path(sd1.path), inplace=True)["key"])
    assert manager.load(record, "tokenizer") is not tokenizer


def test_nodes_get_the_manager_and_the_tensor_store(
    make_app_client: Callable[..., TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[object, object]] = []

    def invoke(self: IntegerInvocation, context: InvocationContext) -> IntegerOutput:
        seen.append((context.models, context.tensors))
        return IntegerOutput(value=self.value)

    monkeypatch.setattr(IntegerInvocation, "invoke", invoke)
    client = make_app_client(run_processor=True)
    graph = {"id": "g", "nodes": {"n": {"id": "n", "type": "integer", "value": 1}}, "edges": []}
    response = client.post("/api/v1/queue/default/enqueue_batch", json={"batch": {"graph": graph}})
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    services = services_of(client)
    [(models, tensors)] = seen
    # The worker's own manager (its device), on the server's records and its one shared RAM cache.
    assert isinstance(models, ModelManager) and tensors is services.tensors
    assert (models.records, models.cache, models.device) == (
        services.models.records,
        services.models.cache,
        services.models.device,
    )


def test_a_context_without_them_says_so() -> None:
    context = InvocationContext(
        queue_id="q",
        item_id=1,
        session_id="s",
        node_id="n",
        node_type="t",
        graph={},
        images=None,  # type: ignore[arg-type]
        on_progress=lambda *_: None,
        is_canceled=lambda: False,
    )
    with pytest.raises(RuntimeError, match="needs models"):
        _ = context.models


def test_a_model_larger_than_the_cache_is_loaded_once_per_node(
    manager: ModelManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The estimate reads the component's config from its files: loading the module for it would load a model the
    # cache cannot keep twice, once for the config and once to run, and say twice that it does not fit.
    import logging

    from invokeai.app.services import model_manager as manager_module

    torch.set_num_threads(1)
    loads: list[str] = []
    real_load = manager_module.load_component

    def counted(probe, component, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(component)
        return real_load(probe, component, **kwargs)

    monkeypatch.setattr(manager_module, "load_component", counted)
    monkeypatch.setattr(manager.cache, "max_cache_ram_bytes", 0)  # nothing fits
    caplog.set_level(logging.INFO, logger="invokeai.backend.cache.model_cache")
    sd1 = manager.resolve(ModelIdentifier(name="demo-sd1"))
    with manager.on_device(sd1, "vae_decode", width=64, height=64) as vae:
        assert isinstance(vae, torch.nn.Module)
    assert loads == ["vae"]
    assert sum("does not fit in the model cache" in r.getMessage() for r in caplog.records) == 1
    assert manager.config(sd1, "vae")["latent_channels"] == vae.config.latent_channels


def test_a_load_from_disk_is_announced_as_invokeai_does(manager: ModelManager, client: TestClient) -> None:
    """model_load_started and model_load_complete, with the model's record and the component, when a component is
    read from disk; not again while the cache holds it."""
    from invokeai.app.services.events import EventBase

    seen: list[EventBase] = []
    client.app.state.events.add_listener(seen.append)  # type: ignore[attr-defined]
    sd1 = manager.resolve(ModelIdentifier(name="demo-sd1"))
    manager.load(sd1, "vae")
    payloads = [event.model_dump(mode="json") for event in seen]
    assert [event.event_name for event in seen] == ["model_load_started", "model_load_complete"]
    record = client.get(f"/api/v2/models/i/{sd1.key}").json()
    for payload in payloads:
        assert (payload["config"], payload["submodel_type"], payload["user_id"]) == (record, "vae", "system")
    manager.load(sd1, "vae")
    assert len(seen) == 2
