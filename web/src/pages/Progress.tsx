import { api, call, QUEUE_ID } from "../api/client";
import { reportError, useStore } from "../store";

async function cancelItem(itemId: number): Promise<void> {
  await call(api.PUT("/api/v1/queue/{queue_id}/i/{item_id}/cancel", { params: { path: { queue_id: QUEUE_ID, item_id: itemId } } }));
}

async function cancelBatch(batchId: string): Promise<void> {
  await call(
    api.PUT("/api/v1/queue/{queue_id}/cancel_by_batch_ids", {
      params: { path: { queue_id: QUEUE_ID } },
      body: { batch_ids: [batchId] },
    }),
  );
}

/** The running item's bar and step preview, and the status of every item of the last batch. */
export function ProgressPanel() {
  const s = useStore();
  const running = s.status?.queue.item_id ?? null;
  const runningItem = s.queueItems.find((i) => i.item_id === running && i.status === "in_progress");
  const p = s.progress && s.progress.itemId === running ? s.progress : null;
  const batchItems = s.batchId ? s.queueItems.filter((i) => i.batch_id === s.batchId) : [];
  const pct = p ? Math.round(p.percentage * 100) : 0;
  return (
    <section class="panel progress-panel" aria-label="Progress">
      <h2>Progress</h2>
      {runningItem || p ? (
        <div class="running">
          <div class="preview-box">
            {p?.preview ? <img class="preview" src={p.preview} alt="Step preview" /> : <div class="preview empty">no preview yet</div>}
          </div>
          <div class="running-info">
            <p>
              Item {running} · {p?.nodeType ?? "starting"} {p && p.total ? `· step ${p.step} / ${p.total}` : ""}
            </p>
            <progress aria-label="Progress of the running item" max={100} value={pct}>
              {pct}%
            </progress>
            <div class="row">
              <button type="button" class="danger" onClick={() => running && cancelItem(running).catch(reportError)}>
                Cancel
              </button>
              {runningItem && (
                <button type="button" onClick={() => cancelBatch(runningItem.batch_id).catch(reportError)}>
                  Cancel batch
                </button>
              )}
            </div>
          </div>
        </div>
      ) : (
        <p class="muted">Nothing is running.</p>
      )}
      {batchItems.length > 0 && (
        <ul class="batch-items" aria-label="Items of the last batch">
          {batchItems.map((i) => (
            <li key={i.item_id}>
              <span>Item {i.item_id}</span> <span class={`status status-${i.status}`}>{i.status.replace("_", " ")}</span>
              {i.error_message && <span class="error-text"> {i.error_message}</span>}
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
