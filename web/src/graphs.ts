import type { Batch, FamilyInfo, Graph, ModelRecord } from "./api/client";
import type { FieldSpec, NodeSpecs } from "./nodeSchemas";

/**
 * One model family as the server describes it (GET /api/v1/app/families): its node types, how they are wired,
 * its guidance, negative and second-prompt behaviour, size step, defaults and image-to-image. The UI knows no
 * family of its own: every fact below comes from that answer, so a family registered on the server shows up here
 * without a change to the web UI.
 */
export type Family = FamilyInfo & {
  /** The denoise input of the step count (InvokeAI's FLUX.1 node: `num_steps`); absent from older servers. */
  steps_field?: string;
};

/** The denoise node's step-count input. */
export function stepsField(family: Family): string {
  return family.steps_field ?? "steps";
}

/** The node roles of a family's graph, as `loader_links` names them. */
export type Role = "text_encoder" | "denoise" | "decode" | "encode";

/** 1 - x, without the float noise (1 - 0.7 = 0.30000000000000004): `denoising_start` from a strength and back. */
function complement(x: number): number {
  return Math.round((1 - x) * 1e6) / 1e6;
}

export function familyOf(families: Family[] | null, name: string | undefined): Family | undefined {
  return families?.find((f) => f.name === name);
}

/** The family whose denoise node has this type (for reading a graph back). */
export function familyOfDenoise(families: Family[] | null, nodeType: unknown): Family | undefined {
  return typeof nodeType === "string" ? families?.find((f) => f.nodes.denoise === nodeType) : undefined;
}

/** Image-to-image: the server says whether the family's nodes run it (an encode node and a `latents` input). */
export function supportsImageToImage(family: Family): boolean {
  return family.image_to_image && !!family.nodes.encode;
}

/**
 * A field of the family's denoise node, from its schema; the size fields take the family's size step when the
 * schema gives none.
 */
export function denoiseSpec(family: Family, specs: NodeSpecs | null, field: string): FieldSpec | undefined {
  const spec = specs?.[family.nodes.denoise]?.[field];
  if (field !== "width" && field !== "height") return spec;
  const kind = spec?.kind ?? "integer";
  return { ...spec, kind, multipleOf: spec?.multipleOf ?? family.size_multiple };
}

/** The schedulers the user may pick: the enum of the denoise node's `scheduler` field, or none without one. */
export function schedulerChoices(family: Family, specs: NodeSpecs | null): string[] {
  return specs?.[family.nodes.denoise]?.scheduler?.enum ?? [];
}

/**
 * The limits of the strength slider (how much of the image changes, 0..1), from the family's strength field:
 * `denoising_strength` is the strength itself, `denoising_start` is 1 - strength.
 */
export function strengthLimits(family: Family, specs: NodeSpecs | null): { minimum: number; maximum: number } {
  const spec = denoiseSpec(family, specs, family.strength_field);
  if (family.strength_field === "denoising_start")
    return { minimum: complement(spec?.maximum ?? 1), maximum: complement(spec?.minimum ?? 0) };
  return { minimum: spec?.minimum ?? 0, maximum: spec?.maximum ?? 1 };
}

/** Whether the negative prompt's encoder is wired in, from the family's `negative` and `guidance.off`. */
export function usesNegative(family: Family, guidance: number, negativePrompt: string): boolean {
  if (family.negative === "always") return guidance > family.guidance.off;
  if (family.negative === "when_given") return negativePrompt.trim() !== "";
  return false;
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
 * The model every node but the denoiser names. A lone transformer (not a `pipeline`) has no text encoders or VAE,
 * so those nodes name the family's first installed pipeline, as docs/examples/*_gguf_* do.
 */
export function companionModel(model: ModelRecord, models: ModelRecord[]): string {
  if (model.pipeline) return model.name;
  return models.find((m) => m.family === model.family && m.pipeline)?.name ?? model.name;
}

type Node = NonNullable<Graph["nodes"]>[string];
type Edge = NonNullable<Graph["edges"]>[number];
type Fields = Record<string, unknown>;

function edge(from: string, out: string, to: string, input: string): Edge {
  return { source: { node_id: from, field: out }, destination: { node_id: to, field: input } };
}

/** The node id of the family's loader, when it has one. */
export const LOADER_ID = "loader";

/**
 * The family's graph: prompt -> text encoder -> denoise -> decode, and for image-to-image image -> encode ->
 * denoise, with the node types, fields and wiring of the family's entry.
 *
 * Without a loader every node names its model (`model: {name}`: the picked model on the denoiser, its companion
 * pipeline on the others). With one, a single loader node names the picked model and feeds every other node
 * through edges loader.<output> -> node.<input>, per role, from `loader_links`.
 */
export function buildGraph(
  family: Family,
  specs: NodeSpecs | null,
  model: ModelRecord,
  models: ModelRecord[],
  s: GenerateSettings,
  seed: number,
): Graph {
  const nodes: Record<string, Fields> = {};
  const edges: Edge[] = [];
  const { loader } = family.nodes;
  if (loader) nodes[LOADER_ID] = { id: LOADER_ID, type: loader, model: { name: model.name } };
  const companion = { name: companionModel(model, models) };
  // A node of `role`: the model named on it without a loader, or the loader's outputs wired into it.
  const add = (id: string, type: string, role: Role, fields: Fields, own = companion): Fields => {
    const node: Fields = { id, type, ...fields };
    if (loader) {
      for (const link of family.loader_links[role] ?? []) edges.push(edge(LOADER_ID, link.output, id, link.input));
    } else {
      node.model = own;
    }
    nodes[id] = node;
    return node;
  };

  const positive: Fields = { prompt: s.prompt };
  if (family.second_prompt_label !== null && s.prompt2.trim()) positive.prompt_2 = s.prompt2;
  add("positive", family.nodes.text_encoder, "text_encoder", positive);
  edges.push(edge("positive", "conditioning", "denoise", family.conditioning_field));
  if (usesNegative(family, s.guidance, s.negativePrompt)) {
    add("negative", family.nodes.text_encoder, "text_encoder", { prompt: s.negativePrompt });
    edges.push(edge("negative", "conditioning", "denoise", "negative_conditioning"));
  }

  const denoise: Fields = {
    width: s.width,
    height: s.height,
    [stepsField(family)]: s.steps,
    [family.guidance.field]: s.guidance,
    seed,
  };
  // Only a family whose denoise node has a scheduler input gets one, and only one of its choices.
  if (schedulerChoices(family, specs).includes(s.scheduler)) denoise.scheduler = s.scheduler;
  const encode = family.nodes.encode;
  if (s.sourceImage && encode && supportsImageToImage(family)) {
    const fields: Fields = { image: { image_name: s.sourceImage } };
    if (specs?.[encode]?.seed) fields.seed = seed;
    add("encode", encode, "encode", fields);
    denoise[family.strength_field] = family.strength_field === "denoising_start" ? complement(s.strength) : s.strength;
    edges.push(edge("encode", "latents", "denoise", "latents"));
  }
  add("denoise", family.nodes.denoise, "denoise", denoise, { name: model.name });
  add("decode", family.nodes.decode, "decode", {});
  edges.push(edge("denoise", "latents", "decode", "latents"));
  const id = `${family.name}_${nodes.encode ? "image" : "text"}_to_image`;
  return { id, nodes: nodes as Record<string, Node>, edges } as Graph;
}

/** One batch for all the images: the seeds go in as batch data (zipped over the nodes that take a seed). */
export function buildBatch(
  family: Family,
  specs: NodeSpecs | null,
  model: ModelRecord,
  models: ModelRecord[],
  s: GenerateSettings,
  seeds: number[],
): Batch {
  const graph = buildGraph(family, specs, model, models, s, seeds[0]);
  const batch: Batch = { graph, runs: 1, origin: "invokeai-web-ui" };
  if (seeds.length > 1) {
    const group = [{ node_path: "denoise", field_name: "seed", items: seeds }];
    const encode = graph.nodes?.encode as unknown as Fields | undefined;
    if (encode && "seed" in encode) group.push({ node_path: "encode", field_name: "seed", items: seeds });
    batch.data = [group];
  }
  return batch;
}

/** The node of the graph whose type is a family's denoise node, and that family. */
export function findDenoise(graph: Graph, families: Family[] | null): { node: Fields; family: Family } | null {
  for (const node of Object.values(graph.nodes ?? {}) as unknown as Fields[]) {
    const family = familyOfDenoise(families, node.type);
    if (family) return { node, family };
  }
  return null;
}

/** The model a graph ran: the one its denoiser names, or with a loader the one the loader names. */
export function graphModel(graph: Graph, found: { node: Fields; family: Family }): { name?: string; key?: string } | undefined {
  const { node: denoise, family } = found;
  let named: Fields | undefined = denoise;
  if (family.nodes.loader) {
    const nodes = Object.values(graph.nodes ?? {}) as unknown as Fields[];
    const feeding = new Set((graph.edges ?? []).filter((x) => x.destination.node_id === denoise.id).map((x) => x.source.node_id));
    const loaders = nodes.filter((n) => n.type === family.nodes.loader);
    named = loaders.find((n) => feeding.has(String(n.id))) ?? loaders[0];
  }
  return named?.model as { name?: string; key?: string } | undefined;
}

/** Generation settings read back from a graph (an image's metadata), for "Use these settings". */
export function settingsFromGraph(graph: Graph, models: ModelRecord[], families: Family[] | null): Partial<GenerateSettings> | null {
  const found = findDenoise(graph, families);
  if (!found) return null;
  const { node: denoise, family } = found;
  const nodeOf = (id: string) => graph.nodes?.[id] as unknown as Fields | undefined;
  const feeding = (input: string): Fields | undefined => {
    const e = (graph.edges ?? []).find((x) => x.destination.node_id === denoise.id && x.destination.field === input);
    return e ? nodeOf(e.source.node_id) : undefined;
  };
  const pos = feeding(family.conditioning_field);
  const neg = feeding("negative_conditioning");
  const enc = feeding("latents");
  const modelRef = graphModel(graph, found);
  const model = models.find((m) => (modelRef?.name !== undefined && m.name === modelRef.name) || (modelRef?.key !== undefined && m.key === modelRef.key));
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
  if (num(stepsField(family)) !== undefined) out.steps = num(stepsField(family));
  if (num("seed") !== undefined) out.seed = num("seed");
  if (num(family.guidance.field) !== undefined) out.guidance = num(family.guidance.field);
  if (typeof denoise.scheduler === "string") out.scheduler = denoise.scheduler;
  const image = enc?.image as { image_name?: string } | undefined;
  out.sourceImage = image?.image_name ?? null;
  const strength = num(family.strength_field);
  if (out.sourceImage && strength !== undefined)
    out.strength = family.strength_field === "denoising_start" ? complement(strength) : strength;
  return out;
}
