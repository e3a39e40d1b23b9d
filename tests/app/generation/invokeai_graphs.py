"""The graphs InvokeAI 6.14.2's frontend builds for SD-1 and SDXL (buildSD1Graph, buildSDXLGraph with addTextToImage
and addImageToImage), written down from its sources: node ids with a prefix ("noise:abc"), every node is_intermediate
and use_cache as its Graph.addNode leaves them, the output node (`canvas_output:...`) with use_cache false and
is_intermediate as its destination says, the seed and prompts in `integer` and `string` nodes that batch data fill,
core_metadata feeding the output's `metadata`. The tests build them here and compare with this server's own graphs."""

from __future__ import annotations

from typing import Any

SEED, STEPS, SIZE = 4242, 6, 64
PROMPT, NEGATIVE = "a lighthouse on a rocky cliff at sunset", "blurry, low quality"
OUTPUT = "canvas_output:abc"


class Graph:
    """The frontend's Graph: addNode leaves is_intermediate and use_cache true unless the node says otherwise."""

    def __init__(self, graph_id: str) -> None:
        self.graph: dict[str, Any] = {"id": graph_id, "nodes": {}, "edges": []}

    def node(self, node_type: str, node_id: str, **fields: Any) -> str:
        self.graph["nodes"][node_id] = {
            "id": node_id,
            "type": node_type,
            "is_intermediate": True,
            "use_cache": True,
            **fields,
        }
        return node_id

    def edge(self, source: str, source_field: str, destination: str, destination_field: str) -> None:
        self.graph["edges"].append(
            {
                "source": {"node_id": source, "field": source_field},
                "destination": {"node_id": destination, "field": destination_field},
            }
        )


def identifier(record: dict[str, Any], base: str) -> dict[str, Any]:
    """ModelIdentifierField as the frontend sends it: key, hash, name, base, type."""
    return {
        "key": record["key"],
        "hash": record.get("hash") or "",
        "name": record["name"],
        "base": base,
        "type": "main",
    }


def sd1_graph(
    model: dict[str, Any],
    *,
    scheduler: str = "euler",
    steps: int = STEPS,
    cfg_scale: float = 7.5,
    size: int = SIZE,
    image: str | None = None,
    strength: float = 0.5,
    gallery: bool = True,
) -> dict[str, Any]:
    """buildSD1Graph: text to image, or image to image from the image named `image` (its size: `size`)."""
    g = Graph("sd1_graph:abc")
    seed = g.node("integer", "seed:abc", value=0)
    positive = g.node("string", "positive_prompt:abc", value="")
    negative = g.node("string", "negative_prompt:abc", value="")
    loader = g.node("main_model_loader", "sd1_model_loader:abc", model=model)
    clip_skip = g.node("clip_skip", "clip_skip:abc", skipped_layers=0)
    pos = g.node("compel", "pos_cond:abc")
    pos_collect = g.node("collect", "pos_cond_collect:abc")
    neg = g.node("compel", "neg_cond:abc")
    neg_collect = g.node("collect", "neg_cond_collect:abc")
    noise = g.node("noise", "noise:abc", use_cpu=True, width=size, height=size)
    denoise = g.node(
        "denoise_latents",
        "denoise_latents:abc",
        cfg_scale=cfg_scale,
        cfg_rescale_multiplier=0,
        hidiffusion=False,
        hidiffusion_raunet=True,
        hidiffusion_window_attn=True,
        scheduler=scheduler,
        steps=steps,
        denoising_start=0 if image is None else 1 - strength,
        denoising_end=1,
    )
    l2i = g.node("l2i", OUTPUT, fp32=False, is_intermediate=not gallery, use_cache=False)
    meta = g.node(
        "core_metadata",
        "core_metadata:abc",
        cfg_scale=cfg_scale,
        cfg_rescale_multiplier=0,
        hidiffusion=False,
        model=model,
        steps=steps,
        rand_device="cpu",
        scheduler=scheduler,
        clip_skip=0,
        generation_mode="txt2img" if image is None else "img2img",
        width=size,
        height=size,
    )
    for edge in (
        (loader, "unet", denoise, "unet"),
        (loader, "clip", clip_skip, "clip"),
        (clip_skip, "clip", pos, "clip"),
        (clip_skip, "clip", neg, "clip"),
        (positive, "value", pos, "prompt"),
        (pos, "conditioning", pos_collect, "item"),
        (pos_collect, "collection", denoise, "positive_conditioning"),
        (negative, "value", neg, "prompt"),
        (neg, "conditioning", neg_collect, "item"),
        (neg_collect, "collection", denoise, "negative_conditioning"),
        (seed, "value", noise, "seed"),
        (noise, "noise", denoise, "noise"),
        (denoise, "latents", l2i, "latents"),
        (seed, "value", meta, "seed"),
        (positive, "value", meta, "positive_prompt"),
        (negative, "value", meta, "negative_prompt"),
        (loader, "vae", l2i, "vae"),
        (meta, "metadata", l2i, "metadata"),
    ):
        g.edge(*edge)
    if image is not None:
        i2l = g.node("i2l", "i2l:abc", fp32=False, image={"image_name": image})
        g.edge(loader, "vae", i2l, "vae")
        g.edge(i2l, "latents", denoise, "latents")
    return g.graph


def sdxl_graph(
    model: dict[str, Any],
    *,
    scheduler: str = "euler",
    steps: int = STEPS,
    cfg_scale: float = 5.0,
    size: int = SIZE,
    image: str | None = None,
    strength: float = 0.5,
    gallery: bool = False,
) -> dict[str, Any]:
    """buildSDXLGraph: text to image (sent to the canvas: its output is intermediate), or image to image. The
    prompts' original and target sizes are the image's (the frontend leaves InvokeAI's 1024 defaults)."""
    g = Graph("sdxl_graph:abc")
    loader = g.node("sdxl_model_loader", "sdxl_model_loader:abc", model=model)
    positive = g.node("string", "positive_prompt:abc", value="")
    negative = g.node("string", "negative_prompt:abc", value="")
    sizes = {
        "original_width": size,
        "original_height": size,
        "target_width": size,
        "target_height": size,
    }
    pos = g.node("sdxl_compel_prompt", "pos_cond:abc", **sizes)
    pos_collect = g.node("collect", "pos_cond_collect:abc")
    neg = g.node("sdxl_compel_prompt", "neg_cond:abc", **sizes)
    neg_collect = g.node("collect", "neg_cond_collect:abc")
    seed = g.node("integer", "seed:abc", value=0)
    noise = g.node("noise", "noise:abc", use_cpu=True, width=size, height=size)
    denoise = g.node(
        "denoise_latents",
        "denoise_latents:abc",
        cfg_scale=cfg_scale,
        cfg_rescale_multiplier=0,
        hidiffusion=False,
        scheduler=scheduler,
        steps=steps,
        denoising_start=0 if image is None else 1 - strength,
        denoising_end=1,
    )
    l2i = g.node("l2i", OUTPUT, fp32=False, is_intermediate=not gallery, use_cache=False)
    meta = g.node(
        "core_metadata",
        "core_metadata:abc",
        cfg_scale=cfg_scale,
        cfg_rescale_multiplier=0,
        model=model,
        steps=steps,
        rand_device="cpu",
        scheduler=scheduler,
        generation_mode="sdxl_txt2img" if image is None else "sdxl_img2img",
        width=size,
        height=size,
    )
    for edge in (
        (loader, "unet", denoise, "unet"),
        (loader, "clip", pos, "clip"),
        (loader, "clip", neg, "clip"),
        (loader, "clip2", pos, "clip2"),
        (loader, "clip2", neg, "clip2"),
        (positive, "value", pos, "prompt"),
        (positive, "value", pos, "style"),
        (negative, "value", neg, "prompt"),
        (negative, "value", neg, "style"),
        (pos, "conditioning", pos_collect, "item"),
        (pos_collect, "collection", denoise, "positive_conditioning"),
        (neg, "conditioning", neg_collect, "item"),
        (neg_collect, "collection", denoise, "negative_conditioning"),
        (seed, "value", noise, "seed"),
        (noise, "noise", denoise, "noise"),
        (denoise, "latents", l2i, "latents"),
        (seed, "value", meta, "seed"),
        (positive, "value", meta, "positive_prompt"),
        (negative, "value", meta, "negative_prompt"),
        (loader, "vae", l2i, "vae"),
        (meta, "metadata", l2i, "metadata"),
    ):
        g.edge(*edge)
    if image is not None:
        i2l = g.node("i2l", "i2l:abc", fp32=False, color_compensation="None", image={"image_name": image})
        g.edge(loader, "vae", i2l, "vae")
        g.edge(i2l, "latents", denoise, "latents")
    return g.graph


def batch_data(seed: int = SEED, prompt: str = PROMPT, negative: str = NEGATIVE) -> list[list[dict[str, Any]]]:
    """The batch data the frontend sends with these graphs: the seed and both prompts."""
    return [
        [
            {"node_path": "seed:abc", "field_name": "value", "items": [seed]},
            {"node_path": "positive_prompt:abc", "field_name": "value", "items": [prompt]},
            {"node_path": "negative_prompt:abc", "field_name": "value", "items": [negative]},
        ]
    ]


def filled(graph: dict[str, Any], seed: int = SEED, prompt: str = PROMPT, negative: str = NEGATIVE) -> dict[str, Any]:
    """The graph with the batch data in place, for running it without the queue."""
    import copy

    graph = copy.deepcopy(graph)
    for entry in batch_data(seed, prompt, negative)[0]:
        graph["nodes"][entry["node_path"]][entry["field_name"]] = entry["items"][0]
    return graph
