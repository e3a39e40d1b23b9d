/** Field limits of the server's nodes, read at run time from the node schemas in its OpenAPI document. */

export interface FieldSpec {
  kind: "integer" | "number" | "string" | "other";
  minimum?: number;
  maximum?: number;
  /** Sizes must be a multiple of this (from multipleOf, or the field's description "a multiple of N"). */
  multipleOf?: number;
  default?: unknown;
  enum?: string[];
  description?: string;
}

export type NodeSpecs = Record<string, Record<string, FieldSpec>>;

interface JsonSchema {
  type?: string;
  const?: string;
  enum?: string[];
  minimum?: number;
  maximum?: number;
  multipleOf?: number;
  default?: unknown;
  description?: string;
  anyOf?: JsonSchema[];
  properties?: Record<string, JsonSchema>;
}

function fieldSpec(schema: JsonSchema): FieldSpec {
  // Optional fields are `anyOf: [{the type}, {"type": "null"}]`; their limits live on the non-null branch.
  const branch = schema.anyOf?.find((s) => s.type && s.type !== "null") ?? schema;
  const type = branch.type;
  const kind = type === "integer" || type === "number" || type === "string" ? type : "other";
  const multiple = branch.multipleOf ?? Number(/multiple of (\d+)/.exec(schema.description ?? "")?.[1] ?? NaN);
  return {
    kind,
    minimum: branch.minimum,
    maximum: branch.maximum,
    multipleOf: Number.isFinite(multiple) ? multiple : undefined,
    default: schema.default ?? branch.default,
    enum: branch.enum,
    description: schema.description,
  };
}

export function parseNodeSpecs(document: unknown): NodeSpecs {
  const schemas = (document as { components?: { schemas?: Record<string, JsonSchema> } }).components?.schemas ?? {};
  const specs: NodeSpecs = {};
  for (const schema of Object.values(schemas)) {
    const nodeType = schema.properties?.type?.const;
    if (!nodeType || !schema.properties) continue;
    const fields: Record<string, FieldSpec> = {};
    for (const [name, prop] of Object.entries(schema.properties)) fields[name] = fieldSpec(prop);
    specs[nodeType] = fields;
  }
  return specs;
}

export async function loadNodeSpecs(): Promise<NodeSpecs> {
  const response = await fetch("/openapi.json", { cache: "no-store" });
  if (!response.ok) throw new Error(`/openapi.json answered ${response.status}`);
  return parseNodeSpecs(await response.json());
}

/** The value moved into the field's range and onto its step, so that the server never refuses it. */
export function clampToSpec(value: number, spec: FieldSpec | undefined, integer = true): number {
  if (!Number.isFinite(value)) value = typeof spec?.default === "number" ? spec.default : 0;
  if (spec?.multipleOf) value = Math.round(value / spec.multipleOf) * spec.multipleOf;
  if (spec?.minimum !== undefined) value = Math.max(spec.minimum, value);
  if (spec?.maximum !== undefined) value = Math.min(spec.maximum, value);
  if (spec?.multipleOf && spec.maximum !== undefined && value > spec.maximum) value -= spec.multipleOf;
  return integer ? Math.round(value) : value;
}
