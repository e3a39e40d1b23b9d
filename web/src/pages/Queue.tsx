import { api, call, QUEUE_ID } from "../api/client";
import { formatDuration, formatTime } from "../format";
import { refreshQueue, reportError, useStore } from "../store";

const path = { params: { path: { queue_id: QUEUE_ID } } };

async function act(what: () => Promise<unknown>): Promise<void> {
  try {
    await what();
  } catch (e) {
    reportError(e);
  }
  await refreshQueue().catch(reportError);
}

export function QueuePage() {
  const s = useStore();
  const q = s.status?.queue;
  const proc = s.status?.processor;
  const items = [...s.queueItems].reverse();
  return (
    <section class="panel" aria-label="Queue">
      <div class="row spread wrap">
        <h2>Queue</h2>
        <div class="row wrap">
          {proc?.is_started === false ? (
            <button type="button" onClick={() => act(() => call(api.PUT("/api/v1/queue/{queue_id}/processor/resume", path)))}>
              Resume
            </button>
          ) : (
            <button type="button" onClick={() => act(() => call(api.PUT("/api/v1/queue/{queue_id}/processor/pause", path)))}>
              Pause
            </button>
          )}
          <button type="button" onClick={() => act(() => call(api.PUT("/api/v1/queue/{queue_id}/prune", path)))}>
            Prune
          </button>
          <button
            type="button"
            class="danger"
            onClick={() => confirm("Delete every item of the queue?") && act(() => call(api.PUT("/api/v1/queue/{queue_id}/clear", path)))}
          >
            Clear
          </button>
          <button type="button" onClick={() => act(async () => undefined)}>
            Refresh
          </button>
        </div>
      </div>
      <dl class="counts" aria-label="Queue counts">
        {(["pending", "in_progress", "completed", "failed", "canceled", "total"] as const).map((k) => (
          <div key={k} class={`count status-${k}`}>
            <dt>{k.replace("_", " ")}</dt>
            <dd>{q ? q[k] : "–"}</dd>
          </div>
        ))}
        <div class="count">
          <dt>processor</dt>
          <dd>{proc ? (proc.is_started ? (proc.is_processing ? "running" : "idle") : "paused") : "–"}</dd>
        </div>
      </dl>
      <div class="table-wrap">
        <table class="queue-table">
          <thead>
            <tr>
              <th scope="col">Item</th>
              <th scope="col">Status</th>
              <th scope="col">Created</th>
              <th scope="col">Started</th>
              <th scope="col">Took</th>
              <th scope="col">Message</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {items.length === 0 && (
              <tr>
                <td colSpan={7} class="muted">
                  The queue is empty.
                </td>
              </tr>
            )}
            {items.map((i) => (
              <tr key={i.item_id}>
                <td>{i.item_id}</td>
                <td>
                  <span class={`status status-${i.status}`}>{i.status.replace("_", " ")}</span>
                </td>
                <td>{formatTime(i.created_at)}</td>
                <td>{formatTime(i.started_at)}</td>
                <td>{formatDuration(i.started_at, i.completed_at)}</td>
                <td class="message">
                  {i.error_message ? `${i.error_type ?? "error"}: ${i.error_message}` : (i.cancel_reason ?? i.read_error ?? "")}
                </td>
                <td>
                  {(i.status === "pending" || i.status === "in_progress") && (
                    <button
                      type="button"
                      aria-label={`Cancel item ${i.item_id}`}
                      onClick={() =>
                        act(() =>
                          call(api.PUT("/api/v1/queue/{queue_id}/i/{item_id}/cancel", { params: { path: { queue_id: QUEUE_ID, item_id: i.item_id } } })),
                        )
                      }
                    >
                      Cancel
                    </button>
                  )}
                  {(i.status === "failed" || i.status === "canceled") && (
                    <button
                      type="button"
                      aria-label={`Retry item ${i.item_id}`}
                      onClick={() =>
                        act(() => call(api.PUT("/api/v1/queue/{queue_id}/retry_items_by_id", { ...path, body: { item_ids: [i.item_id] } })))
                      }
                    >
                      Retry
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
      {s.queueTotal > s.queueItems.length && <p class="muted">Showing the newest {s.queueItems.length} of {s.queueTotal}.</p>}
    </section>
  );
}
