import { defineConfig } from "vite";

// The build is package data of the Python package, so that invokeai-web serves it with no Node.js at run time.
const outDir = "../invokeai/app/web_ui";

export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: {
    outDir,
    emptyOutDir: true,
    // One stable file per kind keeps the committed build's diff readable and the CI comparison exact.
    assetsDir: "assets",
    sourcemap: false,
  },
  server: { proxy: { "/api": "http://127.0.0.1:9090", "/openapi.json": "http://127.0.0.1:9090" } },
});
