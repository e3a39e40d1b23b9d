import { useEffect, useRef, useState } from "preact/hooks";
import { getToken, setToken } from "./api/client";

/** Asked for once when the server answers 401; the token is kept in localStorage and sent as a Bearer header. */
export function TokenDialog(props: { onSaved: () => void }) {
  const ref = useRef<HTMLDialogElement>(null);
  const [value, setValue] = useState("");
  const hadToken = !!getToken();
  useEffect(() => {
    if (!ref.current?.open) ref.current?.showModal();
  }, []);
  return (
    <dialog ref={ref} class="token-dialog" aria-labelledby="token-title" onCancel={(e) => e.preventDefault()}>
      <form
        onSubmit={(e) => {
          e.preventDefault();
          if (!value.trim()) return;
          setToken(value.trim());
          ref.current?.close();
          props.onSaved();
        }}
      >
        <h2 id="token-title">API token</h2>
        <p>
          {hadToken ? "The server refused the saved token." : "This server needs its API token (the api_token setting)."} It is kept in
          this browser only.
        </p>
        <div class="field">
          <label for="api-token">API token</label>
          <input id="api-token" type="password" autocomplete="current-password" value={value} onInput={(e) => setValue((e.target as HTMLInputElement).value)} />
        </div>
        <button type="submit" class="primary">
          Save
        </button>
      </form>
    </dialog>
  );
}
