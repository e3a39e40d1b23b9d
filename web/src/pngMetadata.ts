/** Reads the tEXt / uncompressed iTXt chunks of a PNG: the server puts the generating graph in `invokeai_graph`. */
export function pngTextChunks(bytes: ArrayBuffer): Record<string, string> {
  const view = new DataView(bytes);
  const out: Record<string, string> = {};
  const latin1 = new TextDecoder("latin1");
  const utf8 = new TextDecoder("utf-8");
  const u8 = new Uint8Array(bytes);
  let offset = 8; // the PNG signature
  while (offset + 8 <= bytes.byteLength) {
    const length = view.getUint32(offset);
    const type = latin1.decode(u8.subarray(offset + 4, offset + 8));
    const data = u8.subarray(offset + 8, offset + 8 + length);
    if (type === "tEXt") {
      const nul = data.indexOf(0);
      if (nul > 0) out[latin1.decode(data.subarray(0, nul))] = latin1.decode(data.subarray(nul + 1));
    } else if (type === "iTXt") {
      const nul = data.indexOf(0);
      // keyword NUL, compression flag, method, language NUL, translated keyword NUL, text
      if (nul > 0 && data[nul + 1] === 0) {
        const lang = data.indexOf(0, nul + 3);
        const translated = lang >= 0 ? data.indexOf(0, lang + 1) : -1;
        if (translated >= 0) out[latin1.decode(data.subarray(0, nul))] = utf8.decode(data.subarray(translated + 1));
      }
    } else if (type === "IEND") {
      break;
    }
    offset += 12 + length;
  }
  return out;
}
