#!/usr/bin/env bash
# Everything CUDA-gated, in one command, on a machine with torch + CUDA + pytest and nothing else of the server's
# (no diffusers, fastapi or pydantic; no package registry): the attention tests (the CUDA ones included), the kernel
# benchmark, the wrapper-overhead benchmark, the math-memory calibration, and the Krea-2 step benchmark where
# diffusers imports (carry it: `bash scripts/gpu_wheels.sh` here, then carry ".whl" in the device run).
#
#   bash scripts/gpu_check.sh OUTDIR
#
# Writes OUTDIR/<step>.txt (stdout and stderr of each step), OUTDIR/environment.txt (nvidia-smi, torch, CUDA,
# cuDNN) and OUTDIR/summary.txt (exit status and seconds per step). A failing step does not stop the others; the
# script exits non-zero at the end if any step failed. Each step runs under `timeout`, capped by what is left of a
# total budget (GPU_CHECK_BUDGET_S, default 450 s), so the whole run stays under 8 minutes.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: bash scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$REPO"
# The package is not pip-installed on the GPU machine: it is imported from the working tree.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
PY="${PYTHON:-$(command -v python || command -v python3)}"

# Wheels carried from a machine with a registry (scripts/gpu_wheels.sh: diffusers for the Krea-2 step benchmark).
WHEELS_NOTE="no .whl/ carried"
if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
    SITE="$(mktemp -d)"
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$REPO"/.whl/*.whl \
        >"$OUT/wheels.txt" 2>&1; then
        export PYTHONPATH="$PYTHONPATH:$SITE"
        WHEELS_NOTE="installed from .whl/: $(cd "$REPO/.whl" && echo *.whl)"
    else
        WHEELS_NOTE="installing .whl/ failed (see wheels.txt)"
    fi
fi

BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"
START_S=$SECONDS
FAILED=()
: >"$OUT/summary.txt"

# run_step NAME LIMIT_S COMMAND...: COMMAND's output to OUT/NAME.txt, under min(LIMIT_S, what the budget has left).
run_step() {
    local name="$1" limit="$2"
    shift 2
    local left=$((BUDGET_S - (SECONDS - START_S)))
    if ((left < limit)); then
        limit=$left
    fi
    if ((limit < 5)); then
        echo "not run: the ${BUDGET_S} s budget is spent" >"$OUT/$name.txt"
        printf '%-22s rc=%-4s %5ss  not run, budget spent\n' "$name" "-" 0 | tee -a "$OUT/summary.txt"
        FAILED+=("$name")
        return 0
    fi
    local began=$SECONDS rc=0
    {
        echo "\$ $*  (timeout ${limit}s)"
        timeout --kill-after=10 "$limit" "$@"
    } >"$OUT/$name.txt" 2>&1 || rc=$?
    local note=""
    if ((rc == 124 || rc == 137)); then
        note="timed out after ${limit}s"
    fi
    printf '%-22s rc=%-4s %5ss  %s\n' "$name" "$rc" $((SECONDS - began)) "$note" | tee -a "$OUT/summary.txt"
    if ((rc != 0)); then
        FAILED+=("$name")
    fi
    return 0
}

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -a)"
    echo "python: $PY ($("$PY" --version 2>&1))"
    echo "git: $(git rev-parse HEAD 2>/dev/null || echo 'not a git checkout') $(git status --porcelain 2>/dev/null | wc -l) changed paths"
    echo "wheels: $WHEELS_NOTE"
    echo
    timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi failed (rc $?)"
    echo
    timeout 60 "$PY" - <<'EOF' 2>&1 || echo "torch fingerprint failed (rc $?)"
import importlib.util

import torch
from torch.nn.attention import SDPBackend

print("torch", torch.__version__, "| CUDA", torch.version.cuda, "| HIP", torch.version.hip)
print("cuDNN", torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
print("cuda available", torch.cuda.is_available(), "| devices", torch.cuda.device_count())
for index in range(torch.cuda.device_count()):
    major, minor = torch.cuda.get_device_capability(index)
    print(f"device {index}: {torch.cuda.get_device_name(index)}, sm_{major}{minor}")
print("SDPA priority order", [SDPBackend(b).name for b in torch._C._get_sdp_priority_order()])
for name in ("triton", "sageattention", "diffusers", "pytest"):
    print(name, "importable" if importlib.util.find_spec(name) is not None else "absent")
EOF
} >"$OUT/environment.txt" 2>&1 || true

run_step pytest 150 "$PY" -m pytest -q -rs -p no:cacheprovider tests/backend/attention
run_step attention_kernels 120 "$PY" benchmarks/attention_kernels.py --device cuda
run_step sdpa_overhead 60 "$PY" benchmarks/sdpa_overhead.py
run_step calibrate_math_memory 60 "$PY" scripts/calibrate_sdpa_math_memory.py --device cuda
if [[ ! -f benchmarks/krea2_steps.py ]]; then
    echo "skipped: benchmarks/krea2_steps.py does not exist" >"$OUT/krea2_steps.txt"
    printf '%-22s rc=%-4s %5ss  %s\n' krea2_steps - 0 "skipped, no benchmarks/krea2_steps.py" | tee -a "$OUT/summary.txt"
elif ! "$PY" -c "import diffusers" >/dev/null 2>&1; then
    echo "skipped: diffusers does not import here" >"$OUT/krea2_steps.txt"
    printf '%-22s rc=%-4s %5ss  %s\n' krea2_steps - 0 "skipped, diffusers does not import" | tee -a "$OUT/summary.txt"
else
    run_step krea2_steps 90 "$PY" benchmarks/krea2_steps.py
fi

echo "total $((SECONDS - START_S))s" | tee -a "$OUT/summary.txt"
if ((${#FAILED[@]})); then
    echo "failed: ${FAILED[*]}" | tee -a "$OUT/summary.txt"
    exit 1
fi
echo "all steps passed" | tee -a "$OUT/summary.txt"
