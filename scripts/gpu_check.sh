#!/usr/bin/env bash
# Everything a GPU must measure for this project, in one run (issue 26, section 6), on a machine with torch + CUDA +
# pytest + transformers and nothing else of the server's (no diffusers, fastapi or pydantic; no package registry):
#
#   bash scripts/gpu_check.sh OUTDIR
#   bash scripts/gpu_check.sh --dry-run OUTDIR
#
# The first form needs CUDA (without it, it says so and exits 2) and stays within 8 minutes on one H200. The steps:
#   auto_order             the order auto ranks on this GPU and why, PyTorch's own, the kernel serving each call
#   pytest_attention       tests/backend/attention, the CUDA-gated tests included
#   pytest_cuda            every other CUDA-gated test under tests/backend (pytest -m cuda)
#   attention_kernels      FLUX.1 joint, SDXL self/cross at both levels, Krea-2 masked, Qwen3 GQA causal, bf16 and
#                          fp16: unpatched PyTorch, each kernel, auto, each pin (and auto+autotune), with the target
#                          auto >= 1.00x unpatched and within 3% of the best pin, PASS/FAIL per call
#   autotune               the autotuner's choice per call ("skipped: no autotune module" where there is none)
#   model_steps            a full-width SDXL UNet and a FLUX.1 transformer (a few blocks) step, auto vs unpatched
#   model_memory           their working-memory estimates against torch.cuda.max_memory_allocated
#   first_image            the SD-1 demo's first image in a fresh process against a warm one
#   krea2_steps            real-size Krea-2 denoise steps per INVOKE_KREA2_SDPA_BACKEND mode at 1024x1024
#   calibrate_math_memory  the math kernel's memory per score element against its price
#   sdpa_overhead          the wrapper's per-call cost on this machine's CPU
# The steps that build diffusers models need diffusers, which that machine lacks: run `bash scripts/gpu_wheels.sh`
# here first and carry ".whl" in the device run; the wheels are installed into a scratch folder on PYTHONPATH.
# Without them those steps are skipped, and say so.
#
# --dry-run rehearses the run on any machine (a CPU one included), in under 5 minutes on 2 cores: every step runs
# its code in a tiny CPU configuration (the CUDA-gated tests are collected and skipped), one torch thread each; its
# figures mean nothing. Steps whose measurement needs CUDA say, in the summary, that it was skipped for lack of it.
#
# Writes OUTDIR/<step>.txt (each step's output), OUTDIR/environment.txt (nvidia-smi, torch, CUDA, cuDNN) and
# OUTDIR/summary.txt: one line per step (exit status, seconds, what was skipped) followed by its figures (the lines
# its script prints as "figure: ..."; PASS/FAIL there is a measurement, not the exit status). A failing step does
# not stop the others; the script exits 1 at the end if a step crashed or timed out, else 0. Each step runs under
# `timeout`, capped by what is left of a total budget (GPU_CHECK_BUDGET_S: default 450 s, 280 s for --dry-run).
# GPU_CHECK_STEPS="auto_order attention_kernels" runs only those steps (a rerun of a few); the others say so.
set -euo pipefail

usage() {
    echo "usage: bash scripts/gpu_check.sh [--dry-run] OUTDIR" >&2
    exit 2
}

DRY=0
OUTDIR=""
for arg in "$@"; do
    case "$arg" in
        --dry-run) DRY=1 ;;
        -h | --help) usage ;;
        -*) echo "unknown option $arg: valid is --dry-run" >&2; usage ;;
        *) [[ -z "$OUTDIR" ]] || usage; OUTDIR="$arg" ;;
    esac
done
[[ -n "$OUTDIR" ]] || usage

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUTDIR"
OUT="$(cd "$OUTDIR" && pwd)"
cd "$REPO"
# The package is not pip-installed on the GPU machine: it is imported from the working tree.
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
export HF_HUB_OFFLINE=1
PY="${PYTHON:-$(command -v python || command -v python3)}"

HAVE_CUDA=0
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    HAVE_CUDA=1
fi
if ((!DRY && !HAVE_CUDA)); then
    echo "CUDA is not available here (torch.cuda.is_available() is False for $PY): run this on a GPU machine," >&2
    echo "or rehearse it with: bash scripts/gpu_check.sh --dry-run OUTDIR" >&2
    exit 2
fi
if ((DRY)); then
    # Tiny calls gain nothing from threads, and on a shared small machine OpenMP workers spinning for a busy core
    # make them many times slower.
    export OMP_NUM_THREADS=1
    if ((HAVE_CUDA)); then
        WHY_SKIPPED="skipped: the dry run rehearses on the CPU, not on this machine's CUDA"
    else
        WHY_SKIPPED="skipped for lack of CUDA"
    fi
fi

# Wheels carried from a machine with a registry (scripts/gpu_wheels.sh: diffusers and what it needs).
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
DIFFUSERS_STEPS=(model_steps model_memory first_image krea2_steps)
STEPS="${GPU_CHECK_STEPS:-}"

# selected NAME: whether GPU_CHECK_STEPS (space- or comma-separated; empty: every step) names the step.
selected() {
    [[ -z "$STEPS" || " ${STEPS//,/ } " == *" $1 "* ]]
}

# Importing diffusers takes seconds: asked only when a step that needs it is selected.
HAVE_DIFFUSERS=0
for step in "${DIFFUSERS_STEPS[@]}"; do
    if selected "$step"; then
        if "$PY" -c "import diffusers" >/dev/null 2>&1; then
            HAVE_DIFFUSERS=1
        fi
        break
    fi
done

BUDGET_S="${GPU_CHECK_BUDGET_S:-$((DRY ? 280 : 450))}"
START_S=$SECONDS
FAILED=()
: >"$OUT/summary.txt"
{
    echo "gpu_check $( ((DRY)) && echo "--dry-run " )on $(hostname): $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET_S} s"
    echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $WHEELS_NOTE"
} | tee -a "$OUT/summary.txt"

summary_line() { # NAME RC SECONDS NOTE
    printf '%-22s rc=%-4s %5ss  %s\n' "$1" "$2" "$3" "$4" | tee -a "$OUT/summary.txt"
}

# skip_step NAME WHY: a step that does not run here, on its own line of the summary.
skip_step() {
    if ! selected "$1"; then
        summary_line "$1" - 0 "not selected (GPU_CHECK_STEPS)"
        return 0
    fi
    echo "$2" >"$OUT/$1.txt"
    summary_line "$1" - 0 "$2"
}

# run_step NAME LIMIT_S FIGURES NOTE COMMAND...: COMMAND's output to OUT/NAME.txt, under min(LIMIT_S, what the
# budget has left); then the summary line (NOTE after the status) and the output's lines matching the extended
# regular expression FIGURES ("figure: " lines by default), indented.
run_step() {
    local name="$1" limit="$2" figures="${3:-^figure: }" note="$4"
    shift 4
    if ! selected "$name"; then
        summary_line "$name" - 0 "not selected (GPU_CHECK_STEPS)"
        return 0
    fi
    local left=$((BUDGET_S - (SECONDS - START_S)))
    if ((left < limit)); then
        limit=$left
    fi
    if ((limit < 5)); then
        echo "not run: the ${BUDGET_S} s budget is spent" >"$OUT/$name.txt"
        summary_line "$name" - 0 "not run, budget spent"
        FAILED+=("$name")
        return 0
    fi
    local began=$SECONDS rc=0
    {
        echo "\$ $*  (timeout ${limit}s)"
        timeout --kill-after=10 "$limit" "$@"
    } >"$OUT/$name.txt" 2>&1 || rc=$?
    if ((rc == 124 || rc == 137)); then
        note="timed out after ${limit}s${note:+; $note}"
    fi
    summary_line "$name" "$rc" $((SECONDS - began)) "$note"
    { grep -E -- "$figures" "$OUT/$name.txt" || true; } | sed -e 's/^figure: //' -e 's/^/    /' | tee -a "$OUT/summary.txt"
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
    echo "mode: $( ((DRY)) && echo "dry run (CPU rehearsal)" || echo "full run")"
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
for name in ("triton", "sageattention", "diffusers", "transformers", "pytest"):
    print(name, "importable" if importlib.util.find_spec(name) is not None else "absent")
EOF
} >"$OUT/environment.txt" 2>&1 || true

PYTEST_FIGURES='[0-9]+ (passed|failed|skipped|deselected|errors?)'
# The CUDA-gated tests outside tests/backend/attention (tests/app needs the server's packages, absent there).
mapfile -t CUDA_TEST_FILES < <(grep -rlE 'pytest\.mark\.cuda' tests/backend --include='test_*.py' |
    grep -v '^tests/backend/attention/' | sort)
NEEDS_DIFFUSERS="skipped: diffusers does not import here (bash scripts/gpu_wheels.sh, then carry .whl)"

if ((!DRY)); then
    B=benchmarks
    run_step auto_order 30 "" "" "$PY" $B/attention_choices.py --part order --device cuda
    run_step pytest_attention 90 "$PYTEST_FIGURES" "" \
        "$PY" -m pytest -q -rs -p no:cacheprovider tests/backend/attention
    if ((${#CUDA_TEST_FILES[@]})); then
        run_step pytest_cuda 45 "$PYTEST_FIGURES" "${CUDA_TEST_FILES[*]}" \
            "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda "${CUDA_TEST_FILES[@]}"
    else
        skip_step pytest_cuda "skipped: no CUDA-gated test outside tests/backend/attention"
    fi
    run_step attention_kernels 150 "" "" "$PY" $B/attention_kernels.py --device cuda --rounds 6
    run_step autotune 45 "" "" "$PY" $B/attention_choices.py --part autotune --device cuda
    if ((HAVE_DIFFUSERS)); then
        run_step model_steps 60 "" "" "$PY" $B/model_steps.py --part steps --device cuda
        run_step model_memory 45 "" "" "$PY" $B/model_steps.py --part memory --device cuda
        run_step first_image 60 "" "" "$PY" $B/first_generation.py --device cuda
        run_step krea2_steps 90 '^([0-9]+x[0-9]+$|unset |efficient |cudnn |flash |priority-cudnn )' "" \
            "$PY" $B/krea2_steps.py --sizes 1024 --runs 2
    else
        for step in "${DIFFUSERS_STEPS[@]}"; do
            skip_step "$step" "$NEEDS_DIFFUSERS"
        done
    fi
    run_step calibrate_math_memory 45 '(covers|TOO LOW|priced below)' "" \
        "$PY" scripts/calibrate_sdpa_math_memory.py --device cuda
    run_step sdpa_overhead 30 '\(target' "" "$PY" $B/sdpa_overhead.py --rounds 6 --calls 2000
else
    B=benchmarks
    TINY="dry run: its code in a tiny CPU configuration; the CUDA measurement $WHY_SKIPPED"
    run_step auto_order 30 "" "dry run: the CPU's order and stand-in architectures; this GPU's order $WHY_SKIPPED" \
        "$PY" $B/attention_choices.py --part order --device cpu
    run_step pytest_attention 60 "$PYTEST_FIGURES" \
        "$WHY_SKIPPED: its CUDA-gated tests collected and skipped (the CPU ones run in the suite)" \
        "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/backend/attention
    if ((${#CUDA_TEST_FILES[@]})); then
        run_step pytest_cuda 60 "$PYTEST_FIGURES" "$WHY_SKIPPED: collected and skipped (${CUDA_TEST_FILES[*]})" \
            "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda "${CUDA_TEST_FILES[@]}"
    else
        skip_step pytest_cuda "skipped: no CUDA-gated test outside tests/backend/attention"
    fi
    run_step attention_kernels 60 "" "$TINY" "$PY" $B/attention_kernels.py --device cpu --tiny --rounds 1 --dtypes bf16
    run_step autotune 30 "" "$TINY" "$PY" $B/attention_choices.py --part autotune --device cpu --dtypes bf16
    if ((HAVE_DIFFUSERS)); then
        run_step model_steps 60 "" "$TINY" "$PY" $B/model_steps.py --part steps --device cpu --tiny
        run_step model_memory 60 "" "$TINY" "$PY" $B/model_steps.py --part memory --device cpu --tiny
        run_step first_image 60 "" "dry run: 2 steps on the CPU; the GPU's figures $WHY_SKIPPED" \
            "$PY" $B/first_generation.py --device cpu --steps 2 --warm 1
        run_step krea2_steps 60 '^([0-9]+x[0-9]+$|unset |flash )' \
            "dry run: a tiny transformer on the CPU (--smoke); the real-size one $WHY_SKIPPED" \
            "$PY" $B/krea2_steps.py --smoke --sizes 32 --steps 2 --runs 1 --warmups 1 --modes unset flash
    else
        for step in "${DIFFUSERS_STEPS[@]}"; do
            skip_step "$step" "$NEEDS_DIFFUSERS; the CUDA measurement $WHY_SKIPPED"
        done
    fi
    run_step calibrate_math_memory 60 '(covers|TOO LOW|priced below)' \
        "dry run: the CPU's float32 measurement; the CUDA one $WHY_SKIPPED" \
        "$PY" scripts/calibrate_sdpa_math_memory.py --device cpu --quick --dtypes float32
    run_step sdpa_overhead 30 '\(target' "dry run: fewer rounds (a CPU benchmark on either machine)" \
        "$PY" $B/sdpa_overhead.py --rounds 3 --calls 500
fi

echo "total $((SECONDS - START_S))s" | tee -a "$OUT/summary.txt"
if ((${#FAILED[@]})); then
    echo "failed: ${FAILED[*]}" | tee -a "$OUT/summary.txt"
    exit 1
fi
echo "every step ran to its end (PASS/FAIL above are measurements)" | tee -a "$OUT/summary.txt"
