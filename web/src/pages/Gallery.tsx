import { useEffect, useRef, useState } from "preact/hooks";
import { api, authHeaders, call, getToken, imageUrl, type Graph, type ImageRecord } from "../api/client";
import { findDenoise, graphModel, settingsFromGraph, type GenerateSettings } from "../graphs";
import { AuthImage, downloadImage } from "../AuthImage";
import { pngTextChunks } from "../pngMetadata";
import { getState, loadMoreImages, refreshImages, reportError, setState, useStore } from "../store";

interface Metadata {
  graph?: Graph;
}

/** The graph that made the image: the server writes it in the `invokeai_graph` chunk, as InvokeAI does (images
 * from before kept it inside `invokeai_metadata`). */
async function readMetadata(name: string): Promise<Metadata | null> {
  const response = await fetch(imageUrl(name, "full"), { headers: authHeaders() });
  if (!response.ok) throw new Error(`the image answered ${response.status}`);
  const chunks = pngTextChunks(await response.arrayBuffer());
  if (chunks.invokeai_graph) return { graph: JSON.parse(chunks.invokeai_graph) as Graph };
  const old = chunks.invokeai_metadata ? (JSON.parse(chunks.invokeai_metadata) as Metadata) : null;
  return old?.graph ? { graph: old.graph } : null;
}

let recallSeq = 0;
function recall(settings: Partial<GenerateSettings>): void {
  setState({ recall: { seq: ++recallSeq, settings }, page: "generate" });
  location.hash = "#/generate";
}

function FullView(props: { image: ImageRecord; onClose: () => void }) {
  const { image } = props;
  const ref = useRef<HTMLDialogElement>(null);
  const [meta, setMeta] = useState<Metadata | null | undefined>(undefined);
  const [metaError, setMetaError] = useState<string | null>(null);
  useEffect(() => {
    ref.current?.showModal();
    setMeta(undefined);
    setMetaError(null);
    readMetadata(image.image_name).then(setMeta, (e) => setMetaError(String(e instanceof Error ? e.message : e)));
  }, [image.image_name]);
  const { models, families } = useStore();
  const settings = meta?.graph ? settingsFromGraph(meta.graph, models, families) : null;
  const found = meta?.graph ? findDenoise(meta.graph, families) : null;
  const denoise = found?.node;
  const modelRef = meta?.graph && found ? graphModel(meta.graph, found) : undefined;
  const remove = async () => {
    if (!confirm(`Delete ${image.image_name}?`)) return;
    try {
      await call(api.DELETE("/api/v1/images/i/{image_name}", { params: { path: { image_name: image.image_name } } }));
      props.onClose();
      await refreshImages(Math.max(24, getState().images.length - 1));
    } catch (e) {
      reportError(e);
    }
  };
  return (
    <dialog ref={ref} class="fullview" aria-label="Image" onClose={props.onClose} onCancel={props.onClose}>
      <div class="fullview-body">
        <AuthImage class="full" name={image.image_name} kind="full" alt={`Image ${image.image_name}, full size`} />
        <div class="meta">
          <h2>Image</h2>
          <dl>
            <dt>Size</dt>
            <dd>
              {image.width} × {image.height}
            </dd>
            <dt>Made</dt>
            <dd>{new Date(image.created_at).toLocaleString()}</dd>
            <dt>Origin</dt>
            <dd>{image.origin}</dd>
            {settings && (
              <>
                <dt>Prompt</dt>
                <dd>{settings.prompt || "–"}</dd>
                {settings.negativePrompt ? (
                  <>
                    <dt>Negative</dt>
                    <dd>{settings.negativePrompt}</dd>
                  </>
                ) : null}
              </>
            )}
            {denoise &&
              Object.entries(denoise)
                .filter(([k, v]) => !["id", "is_intermediate", "use_cache"].includes(k) && typeof v !== "object")
                .map(([k, v]) => (
                  <>
                    <dt>{k}</dt>
                    <dd>{String(v)}</dd>
                  </>
                ))}
            {modelRef && (
              <>
                <dt>model</dt>
                <dd>{modelRef.name ?? modelRef.key}</dd>
              </>
            )}
          </dl>
          {meta === undefined && !metaError && <p class="muted">Reading the metadata…</p>}
          {metaError && <p class="error-text">Metadata: {metaError}</p>}
          {meta !== undefined && !settings && <p class="muted">No generation settings in this image.</p>}
          <div class="row wrap">
            <button type="button" class="primary" disabled={!settings} onClick={() => settings && (recall(settings), props.onClose())}>
              Use these settings
            </button>
            <button
              type="button"
              onClick={() => {
                recall({ sourceImage: image.image_name, width: image.width, height: image.height });
                props.onClose();
              }}
            >
              Use as source image
            </button>
            <a
              class="button"
              href={imageUrl(image.image_name, "full")}
              download={image.image_name}
              onClick={(e) => {
                // With a token the plain link would get a 401; the bytes are fetched with the header instead.
                if (!getToken()) return;
                e.preventDefault();
                downloadImage(image.image_name).catch(reportError);
              }}
            >
              Download
            </a>
            <button type="button" class="danger" onClick={() => void remove()}>
              Delete
            </button>
            <button type="button" onClick={() => ref.current?.close()}>
              Close
            </button>
          </div>
        </div>
      </div>
    </dialog>
  );
}

export function GalleryPage() {
  const s = useStore();
  const [open, setOpen] = useState<ImageRecord | null>(null);
  const more = s.images.length < s.imagesTotal;
  return (
    <section class="panel" aria-label="Gallery">
      <div class="row spread">
        <h2>Gallery</h2>
        <span class="muted">
          {s.images.length} of {s.imagesTotal}, newest first
        </span>
      </div>
      {s.images.length === 0 && <p class="muted">No images yet. Generate one.</p>}
      <div class="gallery-grid">
        {s.images.map((i) => (
          <button type="button" class="thumb" key={i.image_name} onClick={() => setOpen(i)} title={`Open ${i.image_name}`}>
            <AuthImage name={i.image_name} kind="thumbnail" alt={`Image ${i.image_name}`} />
          </button>
        ))}
      </div>
      {more && (
        <button type="button" onClick={() => loadMoreImages().catch(reportError)}>
          Load more
        </button>
      )}
      {open && <FullView image={open} onClose={() => setOpen(null)} />}
    </section>
  );
}
