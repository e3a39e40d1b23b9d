import type { AttentionStats } from "../api/client";
import { kernelName, kernelTitle } from "../format";
import { refreshAttention, reportError, useStore } from "../store";

const yes = (b: boolean) => (b ? "yes" : "no");

/** The probe as the server logs it at startup, so the panel and the log read the same. */
export function probeLine(probe: NonNullable<AttentionStats["probe"]>): string {
  return (
    `SDPA kernels on ${probe.device}, torch ${probe.torch}, for ${probe.dtype} [${probe.shape.join(", ")}], ` +
    `${probe.mask}: flash=${yes(probe.flash)} cudnn=${yes(probe.cudnn)} efficient=${yes(probe.efficient)} sage=${yes(probe.sage)}`
  );
}

/** Calls made outside every session worker (scripts, tests); the server names them so. */
const NO_WORKER = "(no worker)";

function CountsTable(props: { counts: AttentionStats["counts"]; caption?: string }) {
  const nodes = Object.keys(props.counts).sort();
  const kernels = [...new Set(nodes.flatMap((n) => Object.keys(props.counts[n])))].sort();
  const max = Math.max(1, ...nodes.flatMap((n) => Object.values(props.counts[n])));
  if (!nodes.length) return <p class="muted">No attention call yet. Generate an image and the counts appear here.</p>;
  return (
    <div class="table-wrap">
      <table class="attention-table">
        <caption>{props.caption ?? "Attention calls per node type and serving kernel"}</caption>
        <thead>
          <tr>
            <th scope="col">Node type</th>
            {kernels.map((k) => (
              <th scope="col" key={k}>
                <span class={`kernel kernel-${kernelName(k).toLowerCase()}`}>{kernelName(k)}</span>
                <span class="kernel-sub">{kernelTitle(k)}</span>
              </th>
            ))}
            <th scope="col">Total</th>
          </tr>
        </thead>
        <tbody>
          {nodes.map((n) => {
            const row = props.counts[n];
            const total = Object.values(row).reduce((a, b) => a + b, 0);
            return (
              <tr key={n}>
                <th scope="row">{n}</th>
                {kernels.map((k) => (
                  <td key={k} class="num">
                    {row[k] ? (
                      <div class="bar-cell">
                        <span class={`bar kernel-bg-${kernelName(k).toLowerCase()}`} style={{ width: `${(100 * row[k]) / max}%` }} />
                        <span class="bar-num">{row[k].toLocaleString()}</span>
                      </div>
                    ) : (
                      <span class="muted">0</span>
                    )}
                  </td>
                ))}
                <td class="num">{total.toLocaleString()}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

/** One table per session worker, shown only where several workers ran attention (one worker: the totals say it). */
function DeviceCounts(props: { byDevice: AttentionStats["counts_by_device"] }) {
  const workers = Object.keys(props.byDevice)
    .filter((w) => w !== NO_WORKER)
    .sort();
  if (workers.length < 2) return null;
  return (
    <>
      <h3>Calls per device</h3>
      {workers.map((w) => (
        <CountsTable key={w} counts={props.byDevice[w]} caption={`Attention calls on ${w}, per node type and serving kernel`} />
      ))}
    </>
  );
}

type Tuned = NonNullable<AttentionStats["tuned"]>[number];
type AutotuneStatus = NonNullable<AttentionStats["autotune"]>;

/** The calls a tuned choice is for, as the server's log names its bucket. */
export function bucketLine(b: Tuned["bucket"]): string {
  const heads = `${b.heads} heads${b.grouped ? ", grouped-query" : ""}`;
  const mask = b.mask === "none" ? "no mask" : b.mask === "causal" ? "causal" : `${b.mask} mask`;
  return `${b.device} ${b.dtype}, head_dim ${b.head_dim}, ${heads}, query ≤${b.query_len}, key ≤${b.key_len}, ${mask}`;
}

const AUTOTUNE_STATUS: Record<AutotuneStatus, string> = {
  off: "off: the ranked order serves every call",
  on: "on: each shape bucket's first call times the kernels that can serve it; the fastest serves the bucket",
  pinned: "on, but attention_backend pins a kernel, which overrides it: nothing is tuned",
};

/** attention_autotune's choices: one row per bucket, each timed kernel's figure, the chosen one marked. */
function TunedTable(props: { tuned: Tuned[] }) {
  if (!props.tuned.length) return <p class="muted">No bucket tuned yet: each one is timed at its first attention call.</p>;
  return (
    <div class="table-wrap">
      <table class="attention-table" aria-label="Tuned kernels">
        <caption>The kernel chosen per shape bucket, and what each kernel measured</caption>
        <thead>
          <tr>
            <th scope="col">Bucket</th>
            <th scope="col">Chosen</th>
            <th scope="col">Timings</th>
            <th scope="col">Source</th>
          </tr>
        </thead>
        <tbody>
          {props.tuned.map((t) => (
            <tr key={bucketLine(t.bucket)}>
              <th scope="row">{bucketLine(t.bucket)}</th>
              <td>
                <span class={`kernel kernel-${kernelName(t.kernel).toLowerCase()}`}>{kernelName(t.kernel)}</span>
              </td>
              <td>
                {t.timings.map((timing) => (
                  <div key={timing.kernel} class={timing.kernel === t.kernel ? "" : "muted"}>
                    {kernelTitle(timing.kernel)}: {timing.ms !== null ? `${timing.ms} ms (best of ${timing.runs})` : timing.note}
                  </div>
                ))}
              </td>
              <td>
                {t.source}
                {t.source === "measured" && <span class="muted"> in {t.cost_ms} ms</span>}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

export function AttentionPage() {
  const a = useStore().attention;
  return (
    <section class="panel" aria-label="Attention">
      <div class="row spread">
        <h2>Attention</h2>
        <button type="button" onClick={() => refreshAttention().catch(reportError)}>
          Refresh
        </button>
      </div>
      {!a ? (
        <p class="muted">Reading the attention report…</p>
      ) : (
        <>
          <div class="attention-summary">
            <div class="stat">
              <span class="stat-label">attention_backend</span>
              <span class="stat-value">{a.setting ?? "not installed"}</span>
            </div>
            <div class="stat">
              <span class="stat-label">Device</span>
              <span class="stat-value">{a.device ?? "–"}</span>
            </div>
            <div class="stat">
              <span class="stat-label">Patched SDPA</span>
              <span class="stat-value">{a.installed ? "in place" : "not installed"}</span>
            </div>
            {a.sage && (
              <div class="stat">
                <span class="stat-label">SageAttention</span>
                <span class="stat-value">{a.sage}</span>
              </div>
            )}
          </div>
          <h3>Ranked order</h3>
          {a.ranked_for && (
            <p class="order-for" aria-label="Ranked for">
              Ranked for <strong>{a.ranked_for}</strong>
            </p>
          )}
          {a.order.length ? (
            <ol class="order" aria-label="Ranked kernel order">
              {a.order.map((k) => (
                <li key={k} class={a.unavailable.includes(k) ? "unavailable" : ""}>
                  <span class={`kernel kernel-${kernelName(k).toLowerCase()}`}>{kernelName(k)}</span>
                  {a.unavailable.includes(k) && <span class="muted"> (not in this build or device)</span>}
                </li>
              ))}
            </ol>
          ) : (
            <p class="muted">No ranking installed.</p>
          )}
          {a.order_reason && (
            <p class="order-reason" aria-label="Why this order">
              Why: {a.order_reason}
            </p>
          )}
          {a.layers.length > 0 && <p>Layers around SDPA: {a.layers.join(" → ")}</p>}
          {a.cudnn_demoted && <p class="error-text">cuDNN was demoted behind math after a failure.</p>}
          {a.window && <p>Benchmarking window open: {a.window}</p>}
          <h3>Autotuning</h3>
          <p aria-label="attention_autotune">
            attention_autotune {AUTOTUNE_STATUS[a.autotune ?? "off"]}
            {a.autotune_file && <span class="muted"> (kept in {a.autotune_file})</span>}
          </p>
          {(a.autotune ?? "off") !== "off" && <TunedTable tuned={a.tuned ?? []} />}
          <h3>Startup probe</h3>
          <p class="probe">
            {a.probe ? <code>{probeLine(a.probe)}</code> : `No probe on ${a.device ?? "this device"}: it runs on CUDA and XPU only.`}
          </p>
          <h3>Calls per node type and kernel</h3>
          <CountsTable counts={a.counts} />
          <DeviceCounts byDevice={a.counts_by_device} />
          <h3>"Not possible" reports</h3>
          {a.reports.length ? (
            <ul class="reports">
              {a.reports.map((r, i) => (
                <li key={i}>
                  <strong>{r.node_type}</strong>: pinned {kernelName(r.pinned)}, served by {kernelName(r.serving)} ({r.reason})
                  <div class="muted">{r.message}</div>
                </li>
              ))}
            </ul>
          ) : (
            <p class="muted">None: every call ran on the first kernel that could serve it.</p>
          )}
          {a.events.length > 0 && (
            <>
              <h3>Run-time changes</h3>
              <ul class="reports">
                {a.events.map((e, i) => (
                  <li key={i}>
                    <strong>{e.event}</strong> in {e.node_type}: {e.error}
                  </li>
                ))}
              </ul>
            </>
          )}
        </>
      )}
    </section>
  );
}
