import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./schema";

export type Schemas = components["schemas"];
export type ModelRecord = Schemas["ModelConfig"];
export type InstallJob = Schemas["ModelInstallJob"];
// InvokeAI's ImageDTO: the record with its URLs and board (this page reads the record's fields).
export type ImageRecord = Schemas["ImageDTO"];
export type QueueItem = Schemas["SessionQueueItem"];
export type QueueStatus = Schemas["SessionQueueAndProcessorStatus"];
export type AttentionStats = Schemas["AttentionStats"];
export type DevicesInfo = Schemas["DevicesInfo"];
export type FamilyInfo = Schemas["FamilyInfo"];
export type Graph = Schemas["Graph"];
export type Batch = Schemas["Batch"];

export const QUEUE_ID = "default";
const TOKEN_KEY = "invokeai.api_token";

export function getToken(): string | null {
  try {
    return localStorage.getItem(TOKEN_KEY);
  } catch {
    return null;
  }
}

export function setToken(token: string): void {
  localStorage.setItem(TOKEN_KEY, token);
}

export function authHeaders(): Record<string, string> {
  const token = getToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

type UnauthorizedListener = () => void;
const unauthorizedListeners = new Set<UnauthorizedListener>();

/** Called whenever the server answers 401: the page then asks for the token (once, however many requests failed). */
export function onUnauthorized(listener: UnauthorizedListener): () => void {
  unauthorizedListeners.add(listener);
  return () => unauthorizedListeners.delete(listener);
}

export function notifyUnauthorized(): void {
  unauthorizedListeners.forEach((l) => l());
}

const auth: Middleware = {
  onRequest({ request }) {
    const token = getToken();
    if (token) request.headers.set("Authorization", `Bearer ${token}`);
    return request;
  },
  onResponse({ response }) {
    if (response.status === 401) notifyUnauthorized();
    return response;
  },
};

export const api = createClient<paths>({ baseUrl: "" });
api.use(auth);

/** The server's own words for a failed request: `detail` as a string, or FastAPI's 422 list joined. */
export function errorMessage(error: unknown, status?: number): string {
  const prefix = status ? `${status}: ` : "";
  if (error && typeof error === "object" && "detail" in error) {
    const detail = (error as { detail: unknown }).detail;
    if (typeof detail === "string") return prefix + detail;
    if (Array.isArray(detail)) {
      return (
        prefix +
        detail
          .map((d) => {
            const entry = d as { loc?: unknown[]; msg?: string };
            const where = Array.isArray(entry.loc) ? entry.loc.join(".") : "";
            return where ? `${where}: ${entry.msg ?? ""}` : (entry.msg ?? JSON.stringify(d));
          })
          .join("; ")
      );
    }
  }
  if (error instanceof Error) return prefix + error.message;
  if (typeof error === "string" && error) return prefix + error;
  return prefix + "the server gave no reason";
}

/** Unwraps an openapi-fetch result, throwing the server's message on an error status. */
export async function call<T>(
  promise: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<T> {
  let result: { data?: T; error?: unknown; response: Response };
  try {
    result = await promise;
  } catch (e) {
    throw new Error(`the server could not be reached (${e instanceof Error ? e.message : String(e)})`);
  }
  if (!result.response.ok) throw new Error(errorMessage(result.error, result.response.status));
  return result.data as T;
}

export function imageUrl(name: string, kind: "full" | "thumbnail"): string {
  return `/api/v1/images/i/${encodeURIComponent(name)}/${kind}`;
}
