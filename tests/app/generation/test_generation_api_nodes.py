"""The generation nodes run in-process on the demo models, with a stand-in model manager that records what each node
reserves: the example graphs make the images diffusers' pipelines make, every model call is reserved with its
estimate, and wrong models, conditioning, latents and sizes are refused with messages that say what is wrong."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError
from wait_support import wait_until

from invokeai.app.nodes.base import BaseInvocationOutput, CanceledError, InvocationContext
from invokeai.app.nodes.graph import Graph, execution_order, prepare_node
from invokeai.app.nodes.sd1 import SDDenoiseInvocation
from invokeai.app.services.events import EventBus
from invokeai.app.services.images import ImageService
from invokeai.app.services.model_manager import ModelManager, probe_of
from invokeai.app.services.model_records import ModelIdentifier, ModelNotFoundError, ModelRecord
from invokeai.app.services.queue_models import Batch
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase
from invokeai.app.services.tensors import TensorStore
from invokeai.backend.cache.working_memory import CallFacts, estimate_working_memory
from invokeai.backend.families import get_family
from invokeai.backend.families.sd1.descriptor import FAMILY as sd1_family
from invokeai.backend.models.loaders import architecture, components_of, load_component, pipeline_options

os.environ["HF_HUB_OFFLINE"] = "1"

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


class StandInManager:
    """ModelManager's interface over demo models loaded once, recording each reservation instead of moving
    anything: (model name, component, working-memory bytes)."""

    device = CPU
    dtype = torch.float32

    def __init__(self, records: list[ModelRecord]) -> None:
        self.records = {record.name: record for record in records}
        self.reservations: list[tuple[str, str, int]] = []
        self._loaded: dict[tuple[str, str], Any] = {}

    def resolve(self, ident: ModelIdentifier) -> ModelRecord:
        for record in self.records.values():
            if ident.name == record.name or ident.key == record.key:
                return record
        raise ModelNotFoundError(f"no model {ident}")

    def components(self, record: ModelRecord) -> list[str]:
        return list(components_of(probe_of(record)))

    def config(self, record: ModelRecord, component: str) -> dict[str, Any]:
        return architecture(probe_of(record), component)

    def pipeline_options(self, record: ModelRecord) -> dict[str, Any]:
        return pipeline_options(probe_of(record))

    def load(self, record: ModelRecord, component: str) -> Any:
        if (record.name, component) not in self._loaded:
            self._loaded[(record.name, component)] = load_component(probe_of(record), component)
        return self._loaded[(record.name, component)]

    # The real manager's arithmetic: the config from the files, the family's estimator, the installed policy.
    facts = ModelManager.facts
    working_memory = ModelManager.working_memory

    @contextmanager
    def on_device(self, record: ModelRecord, operation: str, **facts: Any) -> Iterator[Any]:
        component = get_family(record.family).component_of(operation)
        self.reservations.append((record.name, component, self.working_memory(record, operation, **facts)))
        yield self.load(record, component)

    def models_on_device(self) -> frozenset[str]:
        return frozenset()  # the processor's claim asks; nothing here moves, so nothing is preferred

    def companion(self, record: ModelRecord, component: str) -> ModelRecord:
        return next(
            other
            for other in self.records.values()
            if other.family == record.family and other.format == "diffusers" and component in self.components(other)
        )


@pytest.fixture(scope="session")
def demo_records(tmp_path_factory: pytest.TempPathFactory) -> list[ModelRecord]:
    from invokeai.backend.models.demo import build_demo_models
    from invokeai.backend.models.probe import probe_model

    records = []
    for model in build_demo_models(tmp_path_factory.mktemp("generation-nodes-models")):
        probe = probe_model(model.path)
        records.append(
            ModelRecord(
                key=f"key-{model.name}",
                name=model.name,
                family=probe.family,
                type=probe.type,
                format=probe.format,
                path=str(probe.path),
                size=probe.size,
                hash=None,
                source=str(model.path),
                config_variant=probe.config_variant,
            )
        )
    return records


@pytest.fixture(scope="session")
def session_manager(demo_records: list[ModelRecord]) -> StandInManager:
    """One per session, so each component is loaded once; tests clear its reservations."""
    return StandInManager(demo_records)


@pytest.fixture
def manager(session_manager: StandInManager) -> StandInManager:
    session_manager.reservations.clear()
    return session_manager


class Run:
    """One graph run: what the processor does for a queue item, minus the queue."""

    def __init__(self, manager: StandInManager, tmp_path: Path, cancel_after_steps: int | None = None) -> None:
        self.manager = manager
        self.images = ImageService(SqliteDatabase(None), tmp_path / "outputs", 1 << 20)
        self.tensors = TensorStore()
        self.progress: list[tuple[str, int, int, Image.Image | None]] = []
        self.cancel_after_steps = cancel_after_steps

    def _canceled(self) -> bool:
        return self.cancel_after_steps is not None and len(self.progress) >= self.cancel_after_steps

    def __call__(self, graph_json: dict[str, Any]) -> dict[str, BaseInvocationOutput]:
        graph = Graph.model_validate(graph_json)
        outputs: dict[str, BaseInvocationOutput] = {}
        for node_id in execution_order(graph):
            node = prepare_node(graph, node_id, outputs)

            def on_progress(
                step: int, total: int, preview: Callable[[], Image.Image] | None, node_id: str = node_id
            ) -> None:
                # A watched run: the preview is made, as the processor does while a client reads progress.
                self.progress.append((node_id, step, total, preview and preview()))

            context = InvocationContext(
                queue_id="default",
                item_id=1,
                session_id="session",
                node_id=node_id,
                node_type=node.type,
                graph=graph_json,
                images=self.images,
                on_progress=on_progress,
                is_canceled=self._canceled,
                models=self.manager,  # type: ignore[arg-type]
                tensors=self.tensors,
            )
            outputs[node_id] = node.invoke(context)
        return outputs

    def image(self, output: BaseInvocationOutput) -> Image.Image:
        return self.images.get_pil(output.image.image_name)  # type: ignore[attr-defined]


def example(name: str) -> dict[str, Any]:
    graph: dict[str, Any] = json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))["batch"]["graph"]
    return graph


def with_inputs(graph: dict[str, Any], node_id: str, **inputs: Any) -> dict[str, Any]:
    changed = copy.deepcopy(graph)
    changed["nodes"][node_id].update(inputs)
    return changed


def max_difference(a: Image.Image, b: Image.Image) -> int:
    assert a.size == b.size
    return int(np.abs(np.asarray(a.convert("RGB"), np.int16) - np.asarray(b.convert("RGB"), np.int16)).max())


# --- the examples make the pipelines' images ------------------------------------------------------------------


def _sd_pipeline(manager: StandInManager, scheduler: str, img2img: bool = False) -> Any:
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

    record = manager.records["demo-sd1"]
    cls = StableDiffusionImg2ImgPipeline if img2img else StableDiffusionPipeline
    pipe = cls(
        vae=manager.load(record, "vae"),
        text_encoder=manager.load(record, "text_encoder"),
        tokenizer=manager.load(record, "tokenizer"),
        unet=manager.load(record, "unet"),
        scheduler=sd1_family.make_scheduler(scheduler, dict(manager.load(record, "scheduler").config)),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _text_to_image(pipe: Any, nodes: dict[str, Any], guidance_field: str) -> Image.Image:
    """What `pipe` makes for an example graph's prompts, size, steps, guidance (`guidance_field` of the denoise node)
    and seed."""
    denoise = nodes["denoise"]
    image: Image.Image = pipe(
        nodes["positive"]["prompt"],
        negative_prompt=nodes["negative"]["prompt"],
        width=denoise["width"],
        height=denoise["height"],
        num_inference_steps=denoise["steps"],
        guidance_scale=denoise[guidance_field],
        generator=torch.Generator("cpu").manual_seed(denoise["seed"]),
    ).images[0]
    return image


def test_sd_text_to_image_example_makes_the_pipelines_image(manager: StandInManager, tmp_path: Path) -> None:
    graph = example("sd_text_to_image")
    nodes = graph["nodes"]
    run = Run(manager, tmp_path)
    image = run.image(run(graph)["decode"])
    denoise = nodes["denoise"]
    expected = _text_to_image(_sd_pipeline(manager, denoise["scheduler"]), nodes, guidance_field="cfg_scale")
    assert image.size == (denoise["width"], denoise["height"])
    assert max_difference(image, expected) <= 1


def test_sd_image_to_image_example_makes_the_img2img_pipelines_image(manager: StandInManager, tmp_path: Path) -> None:
    graph = example("sd_image_to_image")
    nodes = graph["nodes"]
    run = Run(manager, tmp_path)
    outputs = run(graph)
    denoise = nodes["denoise"]
    assert nodes["encode"]["seed"] == denoise["seed"], "the example must give both nodes one seed"
    expected = _sd_pipeline(manager, denoise["scheduler"], img2img=True)(
        nodes["positive"]["prompt"],
        image=run.image(outputs["source"]),
        negative_prompt=nodes["negative"]["prompt"],
        strength=denoise["denoising_strength"],
        num_inference_steps=denoise["steps"],
        guidance_scale=denoise["cfg_scale"],
        generator=torch.Generator("cpu").manual_seed(denoise["seed"]),
    ).images[0]
    assert max_difference(run.image(outputs["decode"]), expected) <= 1
    # Only the tail of the schedule runs: the steps reported are the ones strength keeps.
    denoise_steps = [step for node_id, step, _, _ in run.progress if node_id == "denoise"]
    assert denoise_steps == list(range(1, int(denoise["steps"] * denoise["denoising_strength"]) + 1))


def _krea2_pipeline_image(manager: StandInManager, graph: dict[str, Any]) -> Image.Image:
    import json as json_module

    from diffusers import Krea2Pipeline

    nodes = graph["nodes"]
    pipeline = manager.records["demo-krea2"]
    index = json_module.loads((Path(pipeline.path) / "model_index.json").read_text(encoding="utf-8"))
    transformer_record = manager.resolve(ModelIdentifier(**nodes["loader"]["model"]))
    # A transformer of its own: the node installs the grouped-query processor on the one it runs.
    transformer = load_component(probe_of(transformer_record), "transformer")
    pipe = Krea2Pipeline(
        scheduler=manager.load(pipeline, "scheduler"),
        vae=manager.load(pipeline, "vae"),
        text_encoder=manager.load(pipeline, "text_encoder"),
        tokenizer=manager.load(pipeline, "tokenizer"),
        transformer=transformer,
        text_encoder_select_layers=index["text_encoder_select_layers"],
    )
    pipe.set_progress_bar_config(disable=True)
    # InvokeAI's cfg_scale is the pipeline's guidance_scale + 1 (GraphFacts.pipeline_guidance_offset).
    pipeline_nodes = {**nodes, "denoise": {**nodes["denoise"], "guidance_scale": nodes["denoise"]["cfg_scale"] - 1}}
    return _text_to_image(pipe, pipeline_nodes, guidance_field="guidance_scale")


@pytest.mark.parametrize("name", ["krea2_text_to_image", "krea2_gguf_text_to_image"])
def test_krea2_examples_make_the_pipelines_image(manager: StandInManager, tmp_path: Path, name: str) -> None:
    graph = example(name)
    run = Run(manager, tmp_path)
    image = run.image(run(graph)["decode"])
    denoise = graph["nodes"]["denoise"]
    assert image.size == (denoise["width"], denoise["height"])
    assert max_difference(image, _krea2_pipeline_image(manager, graph)) <= 1
    # Every step is reported, with a preview mapped through the VAE that decodes (the paired pipeline's for GGUF).
    steps = [(step, total) for node_id, step, total, _ in run.progress if node_id == "denoise"]
    assert steps == [(s, denoise["steps"]) for s in range(1, denoise["steps"] + 1)]
    size = (denoise["width"] // 8, denoise["height"] // 8)
    assert all(isinstance(p, Image.Image) and p.size == size for *_, p in run.progress)


def test_a_gguf_transformer_alone_names_every_krea2_node(manager: StandInManager, tmp_path: Path) -> None:
    # The text encoder, tokenizer, scheduler and VAE come from the installed Krea-2 pipeline.
    graph = example("krea2_gguf_text_to_image")
    graph["nodes"]["loader"] = {"id": "loader", "type": "krea2_model_loader", "model": {"key": "key-demo-krea2-gguf"}}
    graph = with_inputs(graph, "denoise", steps=2)
    run = Run(manager, tmp_path)
    assert run.image(run(graph)["decode"]).size == (64, 64)
    assert {(name, component) for name, component, _ in manager.reservations} == {
        ("demo-krea2", "text_encoder"),
        ("demo-krea2-gguf", "transformer"),
        ("demo-krea2", "vae"),
    }


# --- working memory -------------------------------------------------------------------------------------------


def test_every_model_call_is_reserved_with_its_estimate(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_image_to_image"), "denoise", steps=2)
    Run(manager, tmp_path)(graph)
    record = manager.records["demo-sd1"]

    def estimate(operation: str, component: str, **facts: Any) -> int:
        config = manager.load(record, component).config
        wm = estimate_working_memory("sd-1", operation, config, CallFacts(device=CPU, dtype=torch.float32, **facts))
        return wm.total(CPU, torch.float32)

    size = {"width": 64, "height": 64}
    assert manager.reservations == [
        ("demo-sd1", "vae", estimate("vae_encode", "vae", **size)),
        ("demo-sd1", "text_encoder", estimate("text_encoder", "text_encoder")),
        ("demo-sd1", "text_encoder", estimate("text_encoder", "text_encoder")),
        ("demo-sd1", "unet", estimate("unet", "unet", guidance=True, **size)),
        ("demo-sd1", "vae", estimate("vae_decode", "vae", **size)),
    ]
    assert all(bytes_ > 0 for _, _, bytes_ in manager.reservations)


def test_krea2_fits_its_preview_map_once_under_a_reservation(demo_records: list[ModelRecord], tmp_path: Path) -> None:
    from invokeai.backend.generation.preview import FIT_COLOURS, FIT_SIZE

    manager = StandInManager(demo_records)  # modules of its own: no map fitted yet
    graph = with_inputs(example("krea2_text_to_image"), "denoise", steps=1)
    Run(manager, tmp_path)(graph)
    first = list(manager.reservations)
    manager.reservations.clear()
    Run(manager, tmp_path)(graph)
    vae = manager.load(manager.records["demo-krea2"], "vae")
    facts = CallFacts(device=CPU, dtype=torch.float32, width=FIT_SIZE, height=FIT_SIZE, batch=FIT_COLOURS)
    fit_bytes = estimate_working_memory("krea2", "vae_decode", vae.config, facts).total(CPU, torch.float32)
    fit = ("demo-krea2", "vae", fit_bytes)
    assert fit in first and first.index(fit) < [component for _, component, _ in first].index("transformer")
    assert fit not in manager.reservations  # the second run reuses the map


def test_sd_denoise_without_guidance_reserves_for_one_unet_batch(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_text_to_image"), "denoise", steps=1, cfg_scale=1.0)
    del graph["nodes"]["negative"]
    graph["edges"] = [e for e in graph["edges"] if e["source"]["node_id"] != "negative"]
    Run(manager, tmp_path)(graph)
    unet = dict(((name, component), b) for name, component, b in manager.reservations)[("demo-sd1", "unet")]
    record = manager.records["demo-sd1"]
    facts = CallFacts(device=CPU, dtype=torch.float32, width=64, height=64, guidance=False)
    config = manager.load(record, "unet").config
    assert unet == estimate_working_memory("sd-1", "unet", config, facts).total(CPU, torch.float32)


# --- progress and cancel ----------------------------------------------------------------------------------------


def test_sd_denoise_reports_every_step_with_a_small_preview(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_text_to_image"), "denoise", steps=3)
    run = Run(manager, tmp_path)
    run(graph)
    assert [(node_id, step, total) for node_id, step, total, _ in run.progress] == [
        ("denoise", s, 3) for s in (1, 2, 3)
    ]
    previews = [preview for *_, preview in run.progress]
    assert all(isinstance(p, Image.Image) and p.size == (8, 8) for p in previews)


@pytest.mark.parametrize("name", ["sd_text_to_image", "krea2_text_to_image"])
def test_a_cancel_stops_the_denoise_at_its_next_step(manager: StandInManager, tmp_path: Path, name: str) -> None:
    run = Run(manager, tmp_path, cancel_after_steps=2)
    with pytest.raises(CanceledError, match="'denoise'"):
        run(with_inputs(example(name), "denoise", steps=50))
    assert [step for _, step, _, _ in run.progress] == [1, 2]


# --- what is refused ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "node_id", "model", "message"),
    [
        ("sd_text_to_image", "denoise", "demo-krea2", "sd_denoise needs a model of the sd-1 family"),
        ("sd_text_to_image", "positive", "demo-krea2-gguf", "sd_text_encoder needs a model of the sd-1 family"),
        ("krea2_text_to_image", "loader", "demo-sd1", "krea2_model_loader needs a model of the krea2 family"),
    ],
)
def test_a_model_of_the_wrong_family_is_refused_by_name(
    manager: StandInManager, tmp_path: Path, name: str, node_id: str, model: str, message: str
) -> None:
    graph = with_inputs(example(name), node_id, model={"name": model})
    family = manager.records[model].family
    with pytest.raises(ValueError, match=f"^model '{model}' is of the {family} family; {message}$"):
        Run(manager, tmp_path)(graph)


def test_an_unknown_model_is_refused_by_name(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_text_to_image"), "positive", model={"name": "no-such-model"})
    with pytest.raises(ModelNotFoundError, match="no-such-model"):
        Run(manager, tmp_path)(graph)


def test_conditioning_of_the_other_family_is_refused(manager: StandInManager, tmp_path: Path) -> None:
    graph = example("krea2_text_to_image")
    graph["nodes"]["positive"] = {"id": "positive", "type": "sd_text_encoder", "model": {"name": "demo-sd1"}}
    graph["edges"] = [e for e in graph["edges"] if e["destination"]["node_id"] != "positive"]
    # InvokeAI's Krea-2 conditioning has a type of its own, so the edge itself is refused.
    with pytest.raises(ValueError, match=r"output type ConditioningField does not fit input type .*Krea2Conditioning"):
        Run(manager, tmp_path)(graph)


def test_sd_denoise_with_guidance_needs_negative_conditioning(manager: StandInManager, tmp_path: Path) -> None:
    graph = example("sd_text_to_image")
    graph["edges"] = [e for e in graph["edges"] if e["source"]["node_id"] != "negative"]
    with pytest.raises(ValueError, match="cfg_scale > 1 needs negative_conditioning"):
        Run(manager, tmp_path)(graph)


def test_image_to_image_latents_of_another_size_are_refused(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_image_to_image"), "source", width=32, height=32)
    with pytest.raises(ValueError, match=r"latents are of a 32x32 image but width x height is 64x64"):
        Run(manager, tmp_path)(graph)


def test_an_image_whose_sides_are_not_multiples_of_8_is_refused(manager: StandInManager, tmp_path: Path) -> None:
    graph = with_inputs(example("sd_image_to_image"), "source", width=60, height=64)
    with pytest.raises(ValueError, match=r"is 60x64; sd_vae_encode needs sides that are multiples of 8"):
        Run(manager, tmp_path)(graph)


@pytest.mark.parametrize(("name", "size", "multiple"), [("sd_text_to_image", 60, 8), ("krea2_text_to_image", 72, 16)])
def test_sizes_the_denoisers_cannot_make_are_refused_when_the_graph_is_parsed(
    name: str, size: int, multiple: int
) -> None:
    graph = with_inputs(example(name), "denoise", width=size)
    refusal = rf"width\n  Input should be a multiple of {multiple} \[type=multiple_of, input_value={size}"
    with pytest.raises(ValidationError, match=refusal):
        Graph.model_validate(graph)


def test_model_fields_take_a_key_or_a_name_or_invokeai_identifier() -> None:
    base = example("sd_text_to_image")
    invokeai = {"key": "abc", "hash": "h", "name": "demo-sd1", "base": "sd-1", "type": "main"}
    # InvokeAI's web UI sends the whole record (path, file_size, ...) as the identifier: the rest is ignored.
    for model in ({"key": "abc"}, {"name": "demo-sd1"}, invokeai, {**invokeai, "file_size": 1, "path": "/x"}):
        Graph.model_validate(with_inputs(base, "denoise", model=model))
    for model in ({}, {"base": "sd-1"}, {"key": 5}):
        with pytest.raises(ValidationError):
            Graph.model_validate(with_inputs(base, "denoise", model=model))


def test_sd_denoise_offers_the_families_samplers() -> None:
    annotation = SDDenoiseInvocation.model_fields["scheduler"].annotation
    assert get_args(annotation) == sd1_family.scheduler_names


# --- what an item leaves behind ---------------------------------------------------------------------------------


@pytest.mark.parametrize("failing", [False, True], ids=["completed", "failed"])
def test_an_items_tensors_are_deleted_when_it_ends(manager: StandInManager, tmp_path: Path, failing: bool) -> None:
    # The failing graph's text encoders save conditioning before its denoise refuses a model of the other family.
    graph = example("sd_text_to_image")
    if failing:
        graph = with_inputs(graph, "denoise", model={"name": "demo-krea2"})
    database = SqliteDatabase(None)
    events = EventBus()
    queue = SessionQueue(database, events, max_queue_size=5)
    tensors = TensorStore()
    saved: list[str] = []
    original_save = tensors.save

    def recording_save(obj: Any, owner: str | None = None) -> str:
        name = original_save(obj, owner)
        saved.append(name)
        return name

    tensors.save = recording_save  # type: ignore[method-assign]
    images = ImageService(database, tmp_path / "outputs", 1 << 20)
    processor = SessionProcessor(queue, images, events, manager, tensors)  # type: ignore[arg-type]
    processor.start()
    try:
        [item_id] = queue.enqueue_batch("default", Batch(graph=Graph.model_validate(graph))).item_ids
        status = wait_until(
            lambda: (s := queue.get("default", item_id).status) in ("completed", "failed") and s,
            timeout=120,
            what="the item to end",
        )
    finally:
        processor.stop()
        database.close()
    assert status == ("failed" if failing else "completed")
    assert len(saved) >= 2  # both conditionings at least
    assert not any(name in tensors for name in saved)
    assert tensors.total_bytes == 0
