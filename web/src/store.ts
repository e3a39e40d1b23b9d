import { useEffect, useState } from "preact/hooks";
import {
  api,
  call,
  QUEUE_ID,
  type AttentionStats,
  type DevicesInfo,
  type ImageRecord,
  type ModelRecord,
  type QueueItem,
  type QueueStatus,
} from "./api/client";
import type { AnyEvent, ConnectionState, EventMap } from "./api/events";
import type { Family, GenerateSettings } from "./graphs";
import type { NodeSpecs } from "./nodeSchemas";

export type Page = "generate" | "queue" | "gallery" | "models" | "attention";

export interface Progress {
  itemId: number;
  nodeType: string;
  step: number;
  total: number;
  percentage: number;
  preview: string | null;
}

/** An install job of this server (GET /api/v2/models/install/{id}), as its model_install_* events report it. */
export interface InstallState {
  id: number;
  name: string;
  source: string;
  bytesDone: number;
  totalBytes: number;
  done: boolean;
  error?: string;
}

export interface State {
  page: Page;
  specs: NodeSpecs | null;
  /** The server's model families (GET /api/v1/app/families), in its order; null until read. */
  families: Family[] | null;
  models: ModelRecord[];
  images: ImageRecord[];
  imagesTotal: number;
  queueItems: QueueItem[];
  queueTotal: number;
  status: QueueStatus | null;
  /** This server's session workers (GET /api/v1/app/devices): one per generation device. */
  devices: DevicesInfo | null;
  attention: AttentionStats | null;
  progress: Progress | null;
  /** The items of the last batch this page enqueued, to show the status of each. */
  batchId: string | null;
  /** By job id. */
  installs: Record<number, InstallState>;
  connection: ConnectionState;
  connectionDetail?: string;
  errors: { id: number; message: string }[];
  tokenNeeded: boolean;
  /** Settings handed from the gallery to the Generate form ("Use these settings"). */
  recall: { seq: number; settings: Partial<GenerateSettings> } | null;
}

let state: State = {
  page: "generate",
  specs: null,
  families: null,
  models: [],
  images: [],
  imagesTotal: 0,
  queueItems: [],
  queueTotal: 0,
  status: null,
  devices: null,
  attention: null,
  progress: null,
  batchId: null,
  installs: {},
  connection: "connecting",
  errors: [],
  tokenNeeded: false,
  recall: null,
};

const listeners = new Set<() => void>();

export function getState(): State {
  return state;
}

export function setState(patch: Partial<State> | ((s: State) => Partial<State>)): void {
  state = { ...state, ...(typeof patch === "function" ? patch(state) : patch) };
  listeners.forEach((l) => l());
}

export function useStore(): State {
  const [, force] = useState(0);
  useEffect(() => {
    const l = () => force((n) => n + 1);
    listeners.add(l);
    return () => {
      listeners.delete(l);
    };
  }, []);
  return state;
}

let errorSeq = 0;
export function reportError(e: unknown): void {
  const message = e instanceof Error ? e.message : String(e);
  // The 401 is handled by the token dialog; repeating it as an error would only add noise.
  if (/^401: /.test(message)) return;
  const id = ++errorSeq;
  setState((s) => ({ errors: [...s.errors.slice(-3), { id, message }] }));
}

export function dismissError(id: number): void {
  setState((s) => ({ errors: s.errors.filter((e) => e.id !== id) }));
}

export const GALLERY_PAGE = 24;

export async function refreshModels(): Promise<void> {
  const data = await call(api.GET("/api/v2/models/"));
  setState({ models: data.models });
}

let familiesLoading: Promise<void> | null = null;
/**
 * The families are read once: at start, or, when that failed (a server with a token answers 401 until the page
 * has it), at the next refresh.
 */
export function loadFamilies(): Promise<void> {
  if (getState().families) return Promise.resolve();
  familiesLoading ??= call(api.GET("/api/v1/app/families"))
    .then((families) => setState({ families }))
    .finally(() => {
      familiesLoading = null;
    });
  return familiesLoading;
}

/** The gallery as InvokeAI's shows it: no intermediate images (steps of a graph); and, as this page says, newest
 * first (InvokeAI's list puts starred images first unless told not to). */
const GALLERY_QUERY = { is_intermediate: false, starred_first: false } as const;

export async function refreshImages(limit = Math.max(GALLERY_PAGE, getState().images.length)): Promise<void> {
  const data = await call(api.GET("/api/v1/images/", { params: { query: { ...GALLERY_QUERY, offset: 0, limit } } }));
  setState({ images: data.items, imagesTotal: data.total });
}

export async function loadMoreImages(): Promise<void> {
  const offset = getState().images.length;
  const data = await call(api.GET("/api/v1/images/", { params: { query: { ...GALLERY_QUERY, offset, limit: GALLERY_PAGE } } }));
  const known = new Set(getState().images.map((i) => i.image_name));
  setState((s) => ({ images: [...s.images, ...data.items.filter((i) => !known.has(i.image_name))], imagesTotal: data.total }));
}

export async function refreshQueue(): Promise<void> {
  const path = { queue_id: QUEUE_ID };
  const status = await call(api.GET("/api/v1/queue/{queue_id}/status", { params: { path } }));
  // The list is oldest first; the newest page is what a user looks at.
  const total = status.queue.total;
  const limit = 100;
  const offset = Math.max(0, total - limit);
  const [list, devices] = await Promise.all([
    call(api.GET("/api/v1/queue/{queue_id}/list", { params: { path, query: { offset, limit } } })),
    call(api.GET("/api/v1/app/devices")),
  ]);
  setState((s) => ({
    status,
    devices,
    queueItems: list.items,
    queueTotal: list.total,
    progress: status.queue.in_progress ? s.progress : null,
  }));
}

export async function refreshAttention(): Promise<void> {
  setState({ attention: await call(api.GET("/api/v1/app/attention")) });
}

export function refreshAll(): void {
  for (const f of [loadFamilies, refreshModels, refreshImages, refreshQueue, refreshAttention]) f().catch(reportError);
}

let queueTimer: ReturnType<typeof setTimeout> | null = null;
/** Many events can arrive in a burst; the queue is re-read once after them. */
function scheduleQueueRefresh(): void {
  if (queueTimer) return;
  queueTimer = setTimeout(() => {
    queueTimer = null;
    refreshQueue().catch(reportError);
  }, 150);
}

function onStatus(e: EventMap["queue_item_status_changed"]): void {
  scheduleQueueRefresh();
  if (e.status === "completed" || e.status === "failed" || e.status === "canceled") {
    setState((s) => (s.progress?.itemId === e.item_id ? { progress: null } : {}));
    if (e.status === "completed") refreshImages().catch(reportError);
    // The attention counts grow with every generation; the panel shows them as they are after each item.
    refreshAttention().catch(reportError);
    if (e.status === "failed" && e.error_message) reportError(`item ${e.item_id} failed: ${e.error_type}: ${e.error_message}`);
  }
}

export function handleEvent(event: AnyEvent): void {
  switch (event.name) {
    case "queue_item_status_changed":
      onStatus(event.data);
      break;
    case "invocation_started":
      setState({
        progress: {
          itemId: event.data.item_id,
          nodeType: event.data.node_type,
          step: 0,
          total: 0,
          percentage: 0,
          preview: getState().progress?.itemId === event.data.item_id ? getState().progress!.preview : null,
        },
      });
      break;
    case "invocation_progress":
      setState((s) => ({
        progress: {
          itemId: event.data.item_id,
          nodeType: event.data.node_type,
          step: event.data.step,
          total: event.data.total,
          percentage: event.data.percentage,
          preview: event.data.image?.dataURL ?? s.progress?.preview ?? null,
        },
      }));
      break;
    case "invocation_complete":
      // A decode node makes the image; the gallery shows it before the item's end.
      if (getState().families?.some((f) => f.nodes.decode === event.data.node_type)) refreshImages().catch(reportError);
      break;
    case "batch_enqueued":
    case "queue_items_canceled":
    case "queue_cleared":
    case "queue_pruned":
    case "queue_items_retried":
    case "invocation_error":
      scheduleQueueRefresh();
      break;
    case "model_install_started":
    case "model_install_progress":
    case "model_install_complete":
    case "model_install_error":
    case "model_install_cancelled": {
      const d = event.data;
      setState((s) => {
        const path = d.source.path;
        const prev = s.installs[d.id] ?? {
          id: d.id,
          name: path.split(/[\\/]/).pop() ?? path,
          source: path,
          bytesDone: 0,
          totalBytes: 0,
          done: false,
        };
        const next: InstallState = { ...prev };
        if (event.name === "model_install_progress") {
          next.bytesDone = event.data.bytes;
          next.totalBytes = event.data.total_bytes;
        } else if (event.name === "model_install_complete") {
          next.name = event.data.config.name;
          next.bytesDone = next.totalBytes = event.data.total_bytes ?? next.totalBytes;
          next.done = true;
        } else if (event.name === "model_install_error") {
          next.done = true;
          next.error = `${event.data.error_type}: ${event.data.error}`;
        } else if (event.name === "model_install_cancelled") {
          next.done = true;
          next.error = "cancelled";
        }
        return { installs: { ...s.installs, [d.id]: next } };
      });
      if (event.name === "model_install_complete") refreshModels().catch(reportError);
      break;
    }
  }
}
