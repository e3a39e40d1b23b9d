import { api, call, QUEUE_ID, type DevicesInfo } from "../api/client";
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

/** A worker's name as the queue shows it: the device part of `<host>:<pid>/<worker>`, and the host when it is
 * another server's (several servers on one PostgreSQL queue share the list). */
function ranOn(worker: string | null | undefined, devices: DevicesInfo | null): string {
  if (!worker) return "";
  const slash = worker.lastIndexOf("/");
  const server = worker.slice(0, slash);
  const name = worker.slice(slash + 1);
  const here = devices ? `${devices.server.host}:${devices.server.pid}` : null;
  return server === here ? name : `${name} on ${server.slice(0, server.lastIndexOf(":"))}`;
}

/** This server's session workers: one per generation device, each with its item and the models on its device. */
function Workers(props: { devices: DevicesInfo | null }) {
  const workers = props.devices?.workers ?? [];
  if (!workers.length) return null;
  return (
    <ul class="workers" aria-label="Workers">
      {workers.map((w) => {
        const onDevice = w.cached_models.filter((m) => m.on_device).length;
        return (
          <li key={w.name} class={`worker ${w.busy ? "busy" : "idle"}`}>
            <strong>{w.name}</strong> <span class="muted">({w.device})</span>:{" "}
            {w.busy ? `running item ${w.item_id}` : "idle"}; {w.items_completed} completed; {onDevice} model component
            {onDevice === 1 ? "" : "s"} on its device
          </li>
        );
      })}
    </ul>
  );
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
      <Workers devices={s.devices} />
      <div class="table-wrap">
        <table class="queue-table">
          <thead>
            <tr>
              <th scope="col">Item</th>
              <th scope="col">Status</th>
              <th scope="col">Created</th>
              <th scope="col">Started</th>
              <th scope="col">Took</th>
              <th scope="col">Ran on</th>
              <th scope="col">Message</th>
              <th scope="col">Actions</th>
            </tr>
          </thead>
          <tbody>
            {items.length === 0 && (
              <tr>
                <td colSpan={8} class="muted">
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
                <td>{ranOn(i.worker, s.devices)}</td>
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
                        act(() => call(api.PUT("/api/v1/queue/{queue_id}/retry_items_by_id", { ...path, body: [i.item_id] })))
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
