import type { components } from "./schema";
import { authHeaders, notifyUnauthorized, QUEUE_ID } from "./client";

type S = components["schemas"];

/** Every event the queue's stream carries, by its SSE name, with the payload schema the OpenAPI document gives. */
export interface EventMap {
  batch_enqueued: S["BatchEnqueuedEvent"];
  queue_items_canceled: S["QueueItemsCanceledEvent"];
  queue_cleared: S["QueueClearedEvent"];
  queue_pruned: S["QueuePrunedEvent"];
  queue_items_retried: S["QueueItemsRetriedEvent"];
  queue_item_status_changed: S["QueueItemStatusChangedEvent"];
  invocation_started: S["InvocationStartedEvent"];
  invocation_progress: S["InvocationProgressEvent"];
  invocation_complete: S["InvocationCompleteEvent"];
  invocation_error: S["InvocationErrorEvent"];
  model_install_started: S["ModelInstallStartedEvent"];
  model_install_progress: S["ModelInstallProgressEvent"];
  model_install_complete: S["ModelInstallCompleteEvent"];
  model_install_error: S["ModelInstallErrorEvent"];
  model_install_cancelled: S["ModelInstallCancelledEvent"];
  model_load_started: S["ModelLoadStartedEvent"];
  model_load_complete: S["ModelLoadCompleteEvent"];
}

export type EventName = keyof EventMap;
export type AnyEvent = { [K in EventName]: { name: K; data: EventMap[K] } }[EventName];

export type ConnectionState = "connecting" | "open" | "closed";

export interface StreamHandlers {
  onEvent: (event: AnyEvent) => void;
  /** After every (re)connect: events missed while disconnected must be caught up over REST. */
  onOpen: () => void;
  onState: (state: ConnectionState, detail?: string) => void;
}

/** Splits an SSE byte stream into events; comment lines (`: ping`) and unknown fields are skipped. */
export class SseParser {
  private buffer = "";

  push(chunk: string): { event: string; data: string }[] {
    this.buffer += chunk.replace(/\r\n?/g, "\n");
    const out: { event: string; data: string }[] = [];
    let end: number;
    while ((end = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      }
      if (data.length) out.push({ event, data: data.join("\n") });
    }
    return out;
  }
}

/**
 * Reads the queue's event stream with fetch rather than EventSource, since EventSource cannot send the
 * Authorization header that a server with api_token needs. Reconnects with a growing delay whenever the stream
 * ends (server restart, or the server cutting off a client that fell behind).
 */
export function openEventStream(handlers: StreamHandlers): () => void {
  let stopped = false;
  let controller: AbortController | null = null;
  let delay = 500;

  const run = async () => {
    while (!stopped) {
      controller = new AbortController();
      handlers.onState("connecting");
      try {
        const response = await fetch(`/api/v1/queue/${QUEUE_ID}/events`, {
          headers: { Accept: "text/event-stream", ...authHeaders() },
          signal: controller.signal,
          cache: "no-store",
        });
        if (response.status === 401) {
          notifyUnauthorized();
          handlers.onState("closed", "the server needs the API token");
        } else if (!response.ok || !response.body) {
          handlers.onState("closed", `event stream answered ${response.status}`);
        } else {
          delay = 500;
          handlers.onState("open");
          handlers.onOpen();
          const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
          const parser = new SseParser();
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            for (const { event, data } of parser.push(value)) {
              try {
                handlers.onEvent({ name: event, data: JSON.parse(data) } as AnyEvent);
              } catch (e) {
                console.warn("unreadable event", event, e);
              }
            }
          }
          handlers.onState("closed", "the event stream ended");
        }
      } catch (e) {
        if (stopped) return;
        handlers.onState("closed", e instanceof Error ? e.message : String(e));
      }
      if (stopped) return;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  };
  void run();
  return () => {
    stopped = true;
    controller?.abort();
  };
}
