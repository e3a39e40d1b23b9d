import { useEffect, useMemo, useState } from "preact/hooks";
import { AuthImage } from "../AuthImage";
import { api, call, QUEUE_ID, type ModelRecord } from "../api/client";
import {
  buildBatch,
  denoiseSpec,
  familyOf,
  schedulerChoices,
  stepsField,
  strengthLimits,
  supportsImageToImage,
  type Family,
  type GenerateSettings,
} from "../graphs";
import { clampToSpec, type FieldSpec } from "../nodeSchemas";
import { refreshImages, refreshQueue, reportError, setState, useStore } from "../store";
import { ProgressPanel } from "./Progress";

const MAX_SEED = 4294967295;
const MAX_IMAGES = 100;

const initial: GenerateSettings = {
  model: "",
  prompt: "",
  prompt2: "",
  negativePrompt: "",
  width: 64,
  height: 64,
  steps: 8,
  guidance: 7.5,
  scheduler: "euler",
  seed: 42,
  randomizeSeed: true,
  images: 1,
  sourceImage: null,
  strength: 0.6,
};

function randomSeed(spec: FieldSpec | undefined): number {
  const max = spec?.maximum ?? MAX_SEED;
  return Math.floor(Math.random() * (max + 1));
}

function NumberField(props: {
  id: string;
  label: string;
  value: number;
  spec: FieldSpec | undefined;
  integer?: boolean;
  step?: number;
  disabled?: boolean;
  onChange: (v: number) => void;
}) {
  const { spec } = props;
  const [text, setText] = useState(String(props.value));
  useEffect(() => setText(String(props.value)), [props.value]);
  const commit = () => {
    const v = clampToSpec(Number(text), spec, props.integer !== false);
    setText(String(v));
    props.onChange(v);
  };
  return (
    <div class="field">
      <label for={props.id}>{props.label}</label>
      <input
        id={props.id}
        type="number"
        value={text}
        min={spec?.minimum}
        max={spec?.maximum}
        step={props.step ?? spec?.multipleOf ?? (props.integer === false ? 0.1 : 1)}
        disabled={props.disabled}
        title={spec?.description}
        onInput={(e) => setText((e.target as HTMLInputElement).value)}
        onChange={commit}
        onBlur={commit}
      />
    </div>
  );
}

/**
 * Whether a model can be picked: of a family the server lists, and a main pipeline or a lone transformer with a
 * pipeline of its family beside it (a lone text encoder or VAE is a part a graph names beside a model, not one to
 * generate with).
 */
function usable(m: ModelRecord, models: ModelRecord[], families: Family[] | null): boolean {
  if (!familyOf(families, m.family)) return false;
  // InvokeAI's type: a pipeline and a lone transformer are both "main"; a lone text encoder or VAE is not.
  return m.type === "main" && (m.pipeline || models.some((x) => x.family === m.family && x.pipeline));
}

export function GeneratePage() {
  const s = useStore();
  const [form, setForm] = useState<GenerateSettings>(initial);
  const [busy, setBusy] = useState(false);
  const families = s.families;
  // In the server's family order, as the picker groups them; the API lists the models by name.
  const models = (families ?? []).flatMap((f) => s.models.filter((m) => m.family === f.name && usable(m, s.models, families)));
  const model = models.find((m) => m.key === form.model) ?? models[0];
  const family = familyOf(families, model?.family);
  const specs = s.specs;
  const spec = (field: string) => (family ? denoiseSpec(family, specs, field) : undefined);
  const i2i = !!(family && supportsImageToImage(family));
  const strength = family ? strengthLimits(family, specs) : { minimum: 0, maximum: 1 };

  /** The size and sampler fitted to the family's denoise node schema (once the schemas are known). */
  const fitToSchema = (fam: Family, f: GenerateSettings): GenerateSettings => {
    if (!specs) return f;
    const d = (field: string) => denoiseSpec(fam, specs, field);
    const schedulers = schedulerChoices(fam, specs);
    return {
      ...f,
      width: clampToSpec(f.width, d("width")),
      height: clampToSpec(f.height, d("height")),
      scheduler: schedulers.includes(f.scheduler) ? f.scheduler : String(d("scheduler")?.default ?? schedulers[0] ?? ""),
    };
  };

  const applyFamilyDefaults = (m: ModelRecord | undefined, f: GenerateSettings): GenerateSettings => {
    const fam = familyOf(families, m?.family);
    if (!fam || !m) return f;
    // The family's facts come with the families; the schema's limits may arrive later (the effect below).
    return fitToSchema(fam, {
      ...f,
      model: m.key,
      guidance: fam.defaults.guidance,
      sourceImage: supportsImageToImage(fam) ? f.sourceImage : null,
    });
  };

  // The first model, once the models and families are known, with its family's defaults; and the size and sampler
  // fitted again when the node schemas arrive, also for a model picked before they did.
  useEffect(() => {
    // The updater checks the model again: a pick made between this render and the effect must stand.
    if (!form.model && model) setForm((f) => (f.model ? f : applyFamilyDefaults(model, f)));
    else if (family && specs) setForm((f) => fitToSchema(family, f));
  }, [model?.key, specs, families]);

  // "Use these settings" from the gallery.
  useEffect(() => {
    if (!s.recall) return;
    const r = s.recall.settings;
    setForm((f) => {
      const m = s.models.find((x) => x.key === r.model) ?? model;
      const next = { ...applyFamilyDefaults(m, f), ...r };
      if (!r.model && m) next.model = m.key;
      return next;
    });
  }, [s.recall?.seq]);

  const set = <K extends keyof GenerateSettings>(key: K, value: GenerateSettings[K]) => setForm((f) => ({ ...f, [key]: value }));

  const invoke = async () => {
    if (!model || !family || !specs) {
      reportError(
        !families ? "the model families are still loading" : models.length ? "the node schemas are still loading" : "no model is installed; install one under Models",
      );
      return;
    }
    const n = clampToSpec(form.images, { kind: "integer", minimum: 1, maximum: MAX_IMAGES });
    const seedSpec = spec("seed");
    const first = form.randomizeSeed ? randomSeed(seedSpec) : clampToSpec(form.seed, seedSpec);
    const max = seedSpec?.maximum ?? MAX_SEED;
    const seeds = Array.from({ length: n }, (_, i) => (form.randomizeSeed && i > 0 ? randomSeed(seedSpec) : (first + i) % (max + 1)));
    const settings: GenerateSettings = {
      ...form,
      width: clampToSpec(form.width, spec("width")),
      height: clampToSpec(form.height, spec("height")),
      steps: clampToSpec(form.steps, spec(stepsField(family))),
      guidance: clampToSpec(form.guidance, spec(family.guidance.field), false),
      strength: clampToSpec(form.strength, { kind: "number", ...strength }, false),
      sourceImage: i2i ? form.sourceImage : null,
    };
    if (form.randomizeSeed) set("seed", first);
    setBusy(true);
    try {
      const batch = buildBatch(family, specs, model, s.models, settings, seeds);
      const result = await call(
        api.POST("/api/v1/queue/{queue_id}/enqueue_batch", { params: { path: { queue_id: QUEUE_ID } }, body: { batch, prepend: false } }),
      );
      setState({ batchId: result.batch.batch_id ?? null });
      await refreshQueue();
    } catch (e) {
      reportError(e);
    } finally {
      setBusy(false);
    }
  };

  const upload = async (file: File) => {
    const body = new FormData();
    body.append("file", file);
    try {
      const record = await call(
        api.POST("/api/v1/images/upload", {
          // InvokeAI's required parameters: a user's upload, shown in the gallery.
          params: { query: { image_category: "user", is_intermediate: false } },
          body: body as never,
          bodySerializer: (b: unknown) => b as FormData,
        }),
      );
      await refreshImages();
      useSource(record.image_name, record.width, record.height);
    } catch (e) {
      reportError(e);
    }
  };

  const useSource = (name: string, width: number, height: number) =>
    setForm((f) => ({ ...f, sourceImage: name, width: clampToSpec(width, spec("width")), height: clampToSpec(height, spec("height")) }));

  const schedulers = family ? schedulerChoices(family, specs) : [];
  const grouped = useMemo(
    () => (families ?? []).map((f) => ({ family: f, models: models.filter((m) => m.family === f.name) })).filter((g) => g.models.length),
    [models, families],
  );
  const source = form.sourceImage ? s.images.find((i) => i.image_name === form.sourceImage) : null;
  const negativeDisabled = family?.negative === "never";

  return (
    <div class="generate">
      <form
        class="panel gen-form"
        aria-label="Generate"
        onSubmit={(e) => {
          e.preventDefault();
          void invoke();
        }}
      >
        <div class="field">
          <label for="gen-model">Model</label>
          <select
            id="gen-model"
            value={model?.key ?? ""}
            onChange={(e) => {
              const m = s.models.find((x) => x.key === (e.target as HTMLSelectElement).value);
              setForm((f) => applyFamilyDefaults(m, { ...f, model: m?.key ?? "" }));
            }}
          >
            {grouped.length === 0 && <option value="">{families ? "no model installed" : "loading…"}</option>}
            {grouped.map((g) => (
              <optgroup key={g.family.name} label={g.family.label}>
                {g.models.map((m) => (
                  <option key={m.key} value={m.key}>
                    {m.name}
                    {m.type !== "main" ? ` (${m.type}, ${m.format})` : ""}
                  </option>
                ))}
              </optgroup>
            ))}
          </select>
        </div>
        <div class="field">
          <label for="gen-prompt">Prompt</label>
          <textarea
            id="gen-prompt"
            rows={3}
            value={form.prompt}
            placeholder="What the image shows (Enter invokes, Shift+Enter for a new line)"
            onInput={(e) => set("prompt", (e.target as HTMLTextAreaElement).value)}
            onKeyDown={(e) => {
              if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
                e.preventDefault();
                set("prompt", (e.target as HTMLTextAreaElement).value);
                // The state update above lands before the next task; invoke reads the form after it.
                setTimeout(() => (document.getElementById("gen-invoke") as HTMLButtonElement | null)?.click(), 0);
              }
            }}
          />
        </div>
        {family && family.second_prompt_label !== null && (
          <div class="field">
            <label for="gen-prompt2">{family.second_prompt_label} (optional)</label>
            <textarea id="gen-prompt2" rows={2} value={form.prompt2} onInput={(e) => set("prompt2", (e.target as HTMLTextAreaElement).value)} />
          </div>
        )}
        <div class="field">
          <label for="gen-negative">Negative prompt</label>
          <textarea
            id="gen-negative"
            rows={2}
            value={negativeDisabled ? "" : form.negativePrompt}
            disabled={negativeDisabled}
            placeholder={negativeDisabled ? `${family?.label} takes no negative prompt` : "What the image avoids"}
            onInput={(e) => set("negativePrompt", (e.target as HTMLTextAreaElement).value)}
          />
        </div>
        <div class="grid2">
          <NumberField id="gen-width" label="Width" value={form.width} spec={spec("width")} onChange={(v) => set("width", v)} />
          <NumberField id="gen-height" label="Height" value={form.height} spec={spec("height")} onChange={(v) => set("height", v)} />
          <NumberField id="gen-steps" label="Steps" value={form.steps} spec={family ? spec(stepsField(family)) : undefined} onChange={(v) => set("steps", v)} />
          <NumberField
            id="gen-guidance"
            label={family?.guidance.label ?? "Guidance"}
            value={form.guidance}
            spec={family ? spec(family.guidance.field) : undefined}
            integer={false}
            step={0.5}
            onChange={(v) => set("guidance", v)}
          />
        </div>
        <div class="field">
          <label for="gen-scheduler">Scheduler</label>
          <select
            id="gen-scheduler"
            value={schedulers.length ? form.scheduler : "flow"}
            disabled={!schedulers.length}
            onChange={(e) => set("scheduler", (e.target as HTMLSelectElement).value)}
          >
            {schedulers.length ? (
              schedulers.map((x) => (
                <option key={x} value={x}>
                  {x}
                </option>
              ))
            ) : (
              <option value="flow">flow-matching Euler (the family's own)</option>
            )}
          </select>
        </div>
        <div class="grid2">
          <NumberField id="gen-seed" label="Seed" value={form.seed} spec={spec("seed")} disabled={form.randomizeSeed} onChange={(v) => set("seed", v)} />
          <NumberField
            id="gen-images"
            label="Images"
            value={form.images}
            spec={{ kind: "integer", minimum: 1, maximum: MAX_IMAGES }}
            onChange={(v) => set("images", v)}
          />
        </div>
        <label class="check">
          <input type="checkbox" checked={form.randomizeSeed} onChange={(e) => set("randomizeSeed", (e.target as HTMLInputElement).checked)} />
          Random seed for each invoke
        </label>
        <fieldset class="i2i" disabled={!i2i}>
          <legend>Image to image {i2i ? "" : `(not available for ${family?.label ?? "this model"})`}</legend>
          {source || form.sourceImage ? (
            <div class="source">
              <AuthImage name={form.sourceImage!} kind="thumbnail" alt="Source image" />
              <button type="button" onClick={() => set("sourceImage", null)}>
                Clear source image
              </button>
            </div>
          ) : (
            <p class="muted">Text to image. Pick a gallery image ("Use as source") or upload one.</p>
          )}
          <div class="field">
            <label for="gen-upload">Upload source image</label>
            <input
              id="gen-upload"
              type="file"
              accept="image/*"
              onChange={(e) => {
                const file = (e.target as HTMLInputElement).files?.[0];
                if (file) void upload(file);
                (e.target as HTMLInputElement).value = "";
              }}
            />
          </div>
          <div class="field">
            <label for="gen-strength">Strength {form.strength.toFixed(2)}</label>
            <input
              id="gen-strength"
              type="range"
              min={strength.minimum}
              max={strength.maximum}
              step={0.01}
              value={form.strength}
              disabled={!form.sourceImage}
              onInput={(e) => set("strength", Number((e.target as HTMLInputElement).value))}
            />
          </div>
        </fieldset>
        <button id="gen-invoke" type="submit" class="primary" disabled={busy}>
          Invoke
        </button>
      </form>
      <div class="gen-side">
        <ProgressPanel />
        <section class="panel" aria-label="Latest images">
          <h2>Latest images</h2>
          <div class="thumbs">
            {s.images.slice(0, 8).map((i) => (
              <button
                type="button"
                class="thumb"
                key={i.image_name}
                title="Use as image-to-image source"
                onClick={() => i2i && useSource(i.image_name, i.width, i.height)}
              >
                <AuthImage name={i.image_name} kind="thumbnail" alt={`Image ${i.image_name}`} />
              </button>
            ))}
          </div>
        </section>
      </div>
    </div>
  );
}
