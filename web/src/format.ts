export function formatBytes(n: number): string {
  if (!Number.isFinite(n) || n < 0) return "?";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

export function formatTime(iso: string | null | undefined): string {
  if (!iso) return "–";
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleTimeString();
}

export function formatDuration(from: string | null | undefined, to: string | null | undefined): string {
  if (!from || !to) return "";
  const ms = new Date(to).getTime() - new Date(from).getTime();
  return Number.isFinite(ms) ? `${(ms / 1000).toFixed(1)} s` : "";
}

/** PyTorch's kernel names as the server reports them (SDPBackend.FLASH_ATTENTION): the last part. */
export function kernelName(raw: string): string {
  return raw.split(".").pop() ?? raw;
}

const KERNEL_TITLES: Record<string, string> = {
  FLASH_ATTENTION: "flash",
  CUDNN_ATTENTION: "cuDNN",
  EFFICIENT_ATTENTION: "memory-efficient",
  MATH: "math",
  OVERRIDEABLE: "overrideable (XPU oneDNN)",
  SAGE: "SageAttention",
};

export function kernelTitle(raw: string): string {
  const name = kernelName(raw);
  return KERNEL_TITLES[name] ?? name.toLowerCase();
}
