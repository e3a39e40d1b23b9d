import { useState } from "preact/hooks";
import { api, call, type ModelRecord } from "../api/client";
import { familyOf } from "../graphs";
import { formatBytes } from "../format";
import { getState, refreshModels, reportError, useStore } from "../store";

function ModelRow(props: { model: ModelRecord }) {
  const m = props.model;
  const [editing, setEditing] = useState(false);
  const [name, setName] = useState(m.name);
  const rename = async () => {
    try {
      await call(api.PATCH("/api/v2/models/i/{key}", { params: { path: { key: m.key } }, body: { name } }));
      setEditing(false);
      await refreshModels();
    } catch (e) {
      reportError(e);
    }
  };
  const remove = async () => {
    if (!confirm(`Delete the model ${m.name}?`)) return;
    try {
      await call(api.DELETE("/api/v2/models/i/{key}", { params: { path: { key: m.key } } }));
      await refreshModels();
    } catch (e) {
      reportError(e);
    }
  };
  return (
    <tr>
      <td>
        {editing ? (
          <form
            class="row"
            onSubmit={(e) => {
              e.preventDefault();
              void rename();
            }}
          >
            <input aria-label={`New name for ${m.name}`} value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
            <button type="submit">Save name</button>
          </form>
        ) : (
          <span title={m.description ?? ""}>{m.name}</span>
        )}
      </td>
      <td>{familyOf(getState().families, m.family)?.label ?? m.family}</td>
      <td>{m.type}</td>
      <td>{m.format}</td>
      <td class="num">{formatBytes(m.size)}</td>
      <td>
        <div class="row">
          <button type="button" aria-label={`Rename ${m.name}`} onClick={() => setEditing(!editing)}>
            {editing ? "Keep name" : "Rename"}
          </button>
          <button type="button" class="danger" aria-label={`Delete ${m.name}`} onClick={() => void remove()}>
            Delete
          </button>
        </div>
      </td>
    </tr>
  );
}

export function ModelsPage() {
  const s = useStore();
  const [source, setSource] = useState("");
  const [name, setName] = useState("");
  const [inplace, setInplace] = useState(false);
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<{ ok: boolean; text: string } | null>(null);
  const install = async () => {
    setBusy(true);
    setResult(null);
    try {
      // As InvokeAI's clients do: the source in the query, the record's fields in the body; the answer is the job,
      // which this page follows until it is done (its events move the progress bar meanwhile).
      const query = { source: source.trim(), inplace };
      let job = await call(
        api.POST("/api/v2/models/install", { params: { query }, body: name.trim() ? { name: name.trim() } : {} }),
      );
      while (!["completed", "error", "cancelled"].includes(job.status)) {
        await new Promise((resolve) => setTimeout(resolve, 250));
        job = await call(api.GET("/api/v2/models/install/{id}", { params: { path: { id: job.id } } }));
      }
      const record = job.config_out;
      if (job.status !== "completed" || !record) throw new Error(job.error ?? `The install was ${job.status}.`);
      setResult({ ok: true, text: `Installed ${record.name} (${familyOf(getState().families, record.family)?.label ?? record.family}).` });
      await refreshModels();
    } catch (e) {
      setResult({ ok: false, text: e instanceof Error ? e.message : String(e) });
    } finally {
      setBusy(false);
    }
  };
  // The form's own failure is shown from the answer; its install event would only repeat it.
  const installs = Object.values(s.installs).filter(
    (i) => !i.done || (i.source === source.trim() && !(i.error && result && !result.ok)),
  );
  return (
    <section class="panel" aria-label="Models">
      <h2>Models</h2>
      <form
        class="install"
        onSubmit={(e) => {
          e.preventDefault();
          void install();
        }}
      >
        <div class="field grow">
          <label for="model-path">Model path</label>
          <input
            id="model-path"
            value={source}
            placeholder="/absolute/path/on/the/server (a pipeline folder, .safetensors or .gguf)"
            onInput={(e) => setSource((e.target as HTMLInputElement).value)}
          />
        </div>
        <div class="field">
          <label for="model-name">Name (optional)</label>
          <input id="model-name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </div>
        <label class="check">
          <input type="checkbox" checked={inplace} onChange={(e) => setInplace((e.target as HTMLInputElement).checked)} />
          Install in place (no copy)
        </label>
        <button type="submit" class="primary" disabled={busy || !source.trim()}>
          Install
        </button>
      </form>
      {installs.map((i) => (
        <div class="install-progress" key={i.id}>
          <span>
            {i.name}: {formatBytes(i.bytesDone)} of {formatBytes(i.totalBytes)}
          </span>
          <progress aria-label={`Install of ${i.name}`} max={Math.max(1, i.totalBytes)} value={i.bytesDone} />
          {i.error && <span class="error-text">{i.error}</span>}
        </div>
      ))}
      {result && (
        <p class={result.ok ? "ok-text" : "error-text"} role={result.ok ? "status" : "alert"}>
          {result.text}
        </p>
      )}
      <div class="table-wrap">
        <table>
          <thead>
            <tr>
              <th scope="col">Name</th>
              <th scope="col">Family</th>
              <th scope="col">Type</th>
              <th scope="col">Format</th>
              <th scope="col">Size</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {s.models.map((m) => (
              <ModelRow key={m.key} model={m} />
            ))}
          </tbody>
        </table>
      </div>
    </section>
  );
}
