import { useEffect, useState } from "preact/hooks";
import { authHeaders, getToken, imageUrl, notifyUnauthorized } from "./api/client";

/**
 * An image of the API. Without a token the browser loads it directly; with one, an <img> cannot send the
 * Authorization header, so the bytes are fetched with it and shown from a blob: URL.
 */
export function AuthImage(props: { name: string; kind: "full" | "thumbnail"; alt: string; class?: string }) {
  const url = imageUrl(props.name, props.kind);
  const token = getToken();
  const [src, setSrc] = useState<string | null>(token ? null : url);
  useEffect(() => {
    if (!token) {
      setSrc(url);
      return;
    }
    let revoked = false;
    let objectUrl: string | null = null;
    fetch(url, { headers: authHeaders() })
      .then(async (r) => {
        if (r.status === 401) notifyUnauthorized();
        if (!r.ok) throw new Error(String(r.status));
        objectUrl = URL.createObjectURL(await r.blob());
        if (!revoked) setSrc(objectUrl);
      })
      .catch(() => setSrc(null));
    return () => {
      revoked = true;
      if (objectUrl) URL.revokeObjectURL(objectUrl);
    };
  }, [url, token]);
  return src ? (
    <img class={props.class} src={src} alt={props.alt} loading="lazy" />
  ) : (
    <span class={`img-placeholder ${props.class ?? ""}`} role="img" aria-label={props.alt} />
  );
}

/** A download of an API image that sends the token when one is set. */
export async function downloadImage(name: string): Promise<void> {
  const r = await fetch(imageUrl(name, "full"), { headers: authHeaders() });
  if (!r.ok) throw new Error(`the image answered ${r.status}`);
  const a = document.createElement("a");
  a.href = URL.createObjectURL(await r.blob());
  a.download = name;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 10000);
}
