import { Component, type ComponentChildren } from "preact";
import { useEffect } from "preact/hooks";
import { onUnauthorized } from "./api/client";
import { openEventStream } from "./api/events";
import { loadNodeSpecs } from "./nodeSchemas";
import { AttentionPage } from "./pages/Attention";
import { GalleryPage } from "./pages/Gallery";
import { GeneratePage } from "./pages/Generate";
import { ModelsPage } from "./pages/Models";
import { QueuePage } from "./pages/Queue";
import { dismissError, handleEvent, refreshAll, reportError, setState, useStore, type Page } from "./store";
import { TokenDialog } from "./TokenDialog";

const PAGES: { id: Page; label: string }[] = [
  { id: "generate", label: "Generate" },
  { id: "queue", label: "Queue" },
  { id: "gallery", label: "Gallery" },
  { id: "models", label: "Models" },
  { id: "attention", label: "Attention" },
];

function pageFromHash(): Page {
  const id = location.hash.replace(/^#\/?/, "");
  return PAGES.find((p) => p.id === id)?.id ?? "generate";
}

/** A render error shows its message instead of a blank page. */
class ErrorBoundary extends Component<{ children: ComponentChildren }, { error: string | null }> {
  state = { error: null as string | null };
  componentDidCatch(error: unknown) {
    this.setState({ error: error instanceof Error ? error.message : String(error) });
  }
  render() {
    if (this.state.error)
      return (
        <div class="panel" role="alert">
          <h2>This page failed</h2>
          <p class="error-text">{this.state.error}</p>
          <button type="button" onClick={() => this.setState({ error: null })}>
            Try again
          </button>
        </div>
      );
    return this.props.children;
  }
}

let closeStream: (() => void) | null = null;
function startStream(): void {
  closeStream?.();
  closeStream = openEventStream({
    onEvent: handleEvent,
    // Whatever happened while the stream was down (finished items, new images) is read again over REST.
    onOpen: refreshAll,
    onState: (connection, connectionDetail) => setState({ connection, connectionDetail }),
  });
}

export function App() {
  const s = useStore();
  useEffect(() => {
    const onHash = () => setState({ page: pageFromHash() });
    onHash();
    window.addEventListener("hashchange", onHash);
    const off = onUnauthorized(() => setState({ tokenNeeded: true }));
    loadNodeSpecs().then((specs) => setState({ specs }), reportError);
    refreshAll();
    startStream();
    return () => {
      window.removeEventListener("hashchange", onHash);
      off();
      closeStream?.();
    };
  }, []);
  const running = s.status?.queue.in_progress ?? 0;
  const pending = s.status?.queue.pending ?? 0;
  return (
    <div class="app">
      <header class="top">
        <div class="brand">
          <span class="logo" aria-hidden="true">
            ◆
          </span>{" "}
          InvokeAI
        </div>
        <nav aria-label="Pages" class="nav">
          {PAGES.map((p) => (
            <a key={p.id} href={`#/${p.id}`} aria-current={s.page === p.id ? "page" : undefined} class={s.page === p.id ? "active" : ""}>
              {p.label}
              {p.id === "queue" && running + pending > 0 ? <span class="badge">{running + pending}</span> : null}
            </a>
          ))}
        </nav>
        <div class={`conn conn-${s.connection}`} role="status" title={s.connectionDetail ?? ""}>
          {s.connection === "open" ? "live" : s.connection === "connecting" ? "connecting…" : "reconnecting…"}
        </div>
      </header>
      {s.errors.length > 0 && (
        <div class="errors" role="alert">
          {s.errors.map((e) => (
            <div class="error" key={e.id}>
              <span>{e.message}</span>
              <button type="button" aria-label="Dismiss error" onClick={() => dismissError(e.id)}>
                ×
              </button>
            </div>
          ))}
        </div>
      )}
      <main>
        <ErrorBoundary>
          {s.page === "generate" && <GeneratePage />}
          {s.page === "queue" && <QueuePage />}
          {s.page === "gallery" && <GalleryPage />}
          {s.page === "models" && <ModelsPage />}
          {s.page === "attention" && <AttentionPage />}
        </ErrorBoundary>
      </main>
      {s.tokenNeeded && (
        <TokenDialog
          onSaved={() => {
            setState({ tokenNeeded: false, errors: [] });
            refreshAll();
            startStream();
          }}
        />
      )}
    </div>
  );
}
