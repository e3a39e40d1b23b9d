import type { Batch, Graph, ModelRecord } from "./api/client";
import type { FieldSpec, NodeSpecs } from "./nodeSchemas";

/** The node types of one model family, and which denoise field holds its guidance. */
export interface Family {
  id: ModelRecord["family"];
  label: string;
  textEncoder: string;
  denoise: string;
  decode: string;
  encode?: string;
  guidanceField: "cfg_scale" | "guidance" | "guidance_scale";
  guidanceLabel: string;
  /** The denoise input the (single) conditioning goes to, for families without a negative prompt. */
  conditioningField: "positive_conditioning" | "conditioning";
  /** Whether a negative encoder is wired in: always, only with a negative prompt, or never. */
  negative: "always" | "when_given" | "never";
  /** The family's text encoder takes a second prompt (SDXL's OpenCLIP, FLUX's T5). */
  secondPrompt: boolean;
}

export const FAMILIES: Family[] = [
  {
    id: "sd-1",
    label: "Stable Diffusion 1.x",
    textEncoder: "sd_text_encoder",
    denoise: "sd_denoise",
    decode: "sd_vae_decode",
    encode: "sd_vae_encode",
    guidanceField: "cfg_scale",
    guidanceLabel: "CFG scale",
    conditioningField: "positive_conditioning",
    negative: "always",
    secondPrompt: false,
  },
  {
    id: "sdxl",
    label: "Stable Diffusion XL",
    textEncoder: "sdxl_text_encoder",
    denoise: "sdxl_denoise",
    decode: "sdxl_vae_decode",
    encode: "sdxl_vae_encode",
    guidanceField: "cfg_scale",
    guidanceLabel: "CFG scale",
    conditioningField: "positive_conditioning",
    negative: "when_given",
    secondPrompt: true,
  },
  {
    id: "flux",
    label: "FLUX.1",
    textEncoder: "flux_text_encoder",
    denoise: "flux_denoise",
    decode: "flux_vae_decode",
    encode: "flux_vae_encode",
    guidanceField: "guidance",
    guidanceLabel: "Guidance",
    conditioningField: "conditioning",
    negative: "never",
    secondPrompt: true,
  },
  {
    id: "krea2",
    label: "Krea-2",
    textEncoder: "krea2_text_encoder",
    denoise: "krea2_denoise",
    decode: "krea2_vae_decode",
    guidanceField: "guidance_scale",
    guidanceLabel: "Guidance scale",
    conditioningField: "positive_conditioning",
    negative: "always",
    secondPrompt: false,
  },
];

export function familyOf(id: string | undefined): Family | undefined {
  return FAMILIES.find((f) => f.id === id);
}

/** Image-to-image needs an encode node in the server and a `latents` input on the denoiser. */
export function supportsImageToImage(family: Family, specs: NodeSpecs): boolean {
  return !!family.encode && !!specs[family.encode] && !!specs[family.denoise]?.latents;
}

export function denoiseSpec(family: Family, specs: NodeSpecs, field: string): FieldSpec | undefined {
  return specs[family.denoise]?.[field];
}

export interface GenerateSettings {
  model: string;
  prompt: string;
  prompt2: string;
  negativePrompt: string;
  width: number;
  height: number;
  steps: number;
  guidance: number;
  scheduler: string;
  seed: number;
  randomizeSeed: boolean;
  images: number;
  /** An image for image-to-image, or null for text-to-image. */
  sourceImage: string | null;
  strength: number;
}

/**
 * The model every node but the denoiser names. A lone transformer (type transformer) has no text encoders or VAE,
 * so those nodes name the family's first installed pipeline, as docs/examples/*_gguf_* do.
 */
export function companionModel(model: ModelRecord, models: ModelRecord[]): string {
  if (model.type === "main") return model.name;
  return models.find((m) => m.family === model.family && m.type === "main")?.name ?? model.name;
}

type Node = NonNullable<Graph["nodes"]>[string];
type Edge = NonNullable<Graph["edges"]>[number];

function edge(from: string, out: string, to: string, input: string): Edge {
  return { source: { node_id: from, field: out }, destination: { node_id: to, field: input } };
}

/** The family's graph, shaped as docs/examples/<family>_{text,image}_to_image.json. */
export function buildGraph(
  family: Family,
  model: ModelRecord,
  models: ModelRecord[],
  s: GenerateSettings,
  seed: number,
): Graph {
  const main = { name: companionModel(model, models) };
  const nodes: Record<string, Node> = {};
  const edges: Edge[] = [];
  const positive: Node = { id: "positive", type: family.textEncoder, model: main, prompt: s.prompt } as Node;
  if (family.secondPrompt && s.prompt2.trim()) (positive as Record<string, unknown>).prompt_2 = s.prompt2;
  const denoise: Record<string, unknown> = {
    id: "denoise",
    type: family.denoise,
    model: { name: model.name },
    width: s.width,
    height: s.height,
    steps: s.steps,
    [family.guidanceField]: s.guidance,
    seed,
  };
  if (family.guidanceField === "cfg_scale") denoise.scheduler = s.scheduler;
  const useNegative =
    family.negative === "always"
      ? !(family.guidanceField === "cfg_scale" ? s.guidance <= 1 : s.guidance <= 0)
      : family.negative === "when_given" && s.negativePrompt.trim() !== "";
  if (s.sourceImage && family.encode) {
    nodes.encode = { id: "encode", type: family.encode, model: main, image: { image_name: s.sourceImage }, seed } as Node;
    denoise.denoising_strength = s.strength;
    edges.push(edge("encode", "latents", "denoise", "latents"));
  }
  nodes.positive = positive;
  if (family.id === "flux") {
    // FLUX.1's prompt node is "prompt" in the examples and feeds the single conditioning input.
    nodes.prompt = { ...positive, id: "prompt" } as Node;
    delete nodes.positive;
    edges.push(edge("prompt", "conditioning", "denoise", family.conditioningField));
  } else {
    edges.push(edge("positive", "conditioning", "denoise", family.conditioningField));
  }
  if (useNegative) {
    nodes.negative = { id: "negative", type: family.textEncoder, model: main, prompt: s.negativePrompt } as Node;
    edges.push(edge("negative", "conditioning", "denoise", "negative_conditioning"));
  }
  nodes.denoise = denoise as Node;
  nodes.decode = { id: "decode", type: family.decode, model: main } as Node;
  edges.push(edge("denoise", "latents", "decode", "latents"));
  return { id: `${family.id.replace("-1", "")}_${s.sourceImage ? "image" : "text"}_to_image`, nodes, edges } as Graph;
}

/** One batch for all the images: the seeds go in as batch data (zipped over the denoise and encode nodes). */
export function buildBatch(
  family: Family,
  model: ModelRecord,
  models: ModelRecord[],
  s: GenerateSettings,
  seeds: number[],
): Batch {
  const graph = buildGraph(family, model, models, s, seeds[0]);
  const batch: Batch = { graph, runs: 1, origin: "invokeai-web-ui" };
  if (seeds.length > 1) {
    const group = [{ node_path: "denoise", field_name: "seed", items: seeds }];
    if (graph.nodes?.encode) group.push({ node_path: "encode", field_name: "seed", items: seeds });
    batch.data = [group];
  }
  return batch;
}

/** Generation settings read back from a graph (an image's metadata), for "Use these settings". */
export function settingsFromGraph(graph: Graph, models: ModelRecord[]): Partial<GenerateSettings> | null {
  const nodes = Object.values(graph.nodes ?? {}) as unknown as Record<string, unknown>[];
  const denoise = nodes.find((n) => typeof n.type === "string" && (n.type as string).endsWith("_denoise"));
  if (!denoise) return null;
  const family = FAMILIES.find((f) => f.denoise === denoise.type);
  if (!family) return null;
  const feeding = (input: string): Record<string, unknown> | undefined => {
    const e = (graph.edges ?? []).find((x) => x.destination.node_id === denoise.id && x.destination.field === input);
    return e ? (graph.nodes?.[e.source.node_id] as unknown as Record<string, unknown>) : undefined;
  };
  const pos = feeding(family.conditioningField);
  const neg = feeding("negative_conditioning");
  const enc = feeding("latents");
  const modelRef = denoise.model as { name?: string; key?: string } | undefined;
  const model = models.find((m) => m.name === modelRef?.name || m.key === modelRef?.key);
  const out: Partial<GenerateSettings> = {
    prompt: typeof pos?.prompt === "string" ? pos.prompt : "",
    prompt2: typeof pos?.prompt_2 === "string" ? pos.prompt_2 : "",
    negativePrompt: typeof neg?.prompt === "string" ? neg.prompt : "",
    randomizeSeed: false,
  };
  if (model) out.model = model.key;
  const num = (k: string): number | undefined => (typeof denoise[k] === "number" ? (denoise[k] as number) : undefined);
  if (num("width") !== undefined) out.width = num("width");
  if (num("height") !== undefined) out.height = num("height");
  if (num("steps") !== undefined) out.steps = num("steps");
  if (num("seed") !== undefined) out.seed = num("seed");
  if (num(family.guidanceField) !== undefined) out.guidance = num(family.guidanceField);
  if (typeof denoise.scheduler === "string") out.scheduler = denoise.scheduler;
  const image = enc?.image as { image_name?: string } | undefined;
  out.sourceImage = image?.image_name ?? null;
  if (out.sourceImage && num("denoising_strength") !== undefined) out.strength = num("denoising_strength");
  return out;
}
