#!/usr/bin/env bash
# ditgate's GPU benchmarks in a few stages that compose: `bash benchmarks/gpu.sh install tests kernels` runs three.
#
# The GPU machine has Python 3.12 and a CUDA torch but no network. What it lacks travels as wheels, fetched once on a
# machine with network by `bash benchmarks/fetch_gpu_wheels.sh`: .whl/ (diffusers, flash-attn-4 and its needs,
# sageattention) and the 92 MB cutlass cu13 library wheel that flash-attn-4 needs, split into .big/a and .big/b,
# because a call carries at most 64 MiB. /tmp outlives a call while the machine stays warm, so a fresh machine takes:
#
#   bash benchmarks/gpu.sh prep                     (carry .big/a)  then again (carry .big/b): the halves into /tmp
#   bash benchmarks/gpu.sh install tests kernels    (carry .whl)    join the halves, install, then the stages
#   bash benchmarks/gpu.sh models                   (no carry, same warm machine)
#   bash benchmarks/gpu.sh sparse                   (no carry, same warm machine)
#
# Stages:
#   prep      copy the carried halves of the cutlass wheel to /tmp
#   install   join them, pip install every carried wheel into /tmp/site, print the versions
#   tests     the GPU tests (pytest -m gpu), then the kernel tests on CUDA
#   kernels   ditgate bench kernels at the attention shapes of real models ($KERNEL_SHAPES)
#   models    ditgate bench model, whole forwards: stock diffusers against ditgate's profiles and the sparse
#             stage, per "preset:blocks" in $MODELS, each under $EACH seconds
#   sparse    benchmarks/sparse_attention.py: the sparse forms against fa4 and cuDNN on activations captured
#             from the model classes, per preset in $SPARSE_MODELS
#   lists     the Hopper kernel alone over FP8 block lists at densities 0.125-1 against dense, at LTX and Wan-14B
#             (benchmarks/experiments/fixed_costs.py): the bound of 1.15 x density x dense
# Each stage writes under $OUT/<stage>/ (JSON, PNG, logs; at most two folders down, which the device tool returns)
# and the script ends with a short table of every result (benchmarks/summary.py). Every call is at most 10 minutes:
# the defaults keep each stage well inside that, one stage per call for models and sparse.
# To add a stage: a function stage_<name> that writes under "$OUT/<name>", and a line in the usage list above.
set -uo pipefail
OUT=${OUT:-ditgate-out}
SITE=/tmp/site
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD"
export PYTHONUNBUFFERED=1
CU13=/tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
KERNEL_SHAPES=${KERNEL_SHAPES:-"flux-1024 ltx-768x512x121 ltx-1216x704x257 wan-1.3b-480p wan-14b-480p"}
MODELS=${MODELS:-"wan-1.3b-480p-81f:10 ltx-2b-1216x704x257:8 flux-dev-1024:8"}
EACH=${EACH:-180}
SPARSE_MODELS=${SPARSE_MODELS:-"ltx-2b-1216x704x257"}  # wan-14b-480p-81f takes about 7 minutes alone
NOISE="aux_data\|exe_args\|Attention backends are\|float32\|Warn"  # Gluon and diffusers lines nobody reads

quiet() { grep -v "$NOISE"; }

gpu_line() {  # the GPU, its driver and clock, into the stage's folder
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$1/gpu.txt"
}

stage_prep() {
    for half in .big/a/cu13.partaa .big/b/cu13.partab; do
        [ -f "$half" ] && cp "$half" /tmp/ && echo "copied $half to /tmp"
    done
    ls -la /tmp/cu13.part* 2>/dev/null || echo "no half of the cutlass wheel carried: carry .big/a, then .big/b"
}

stage_install() {
    local dir=$OUT/install wheels=(.whl/*.whl)
    mkdir -p "$dir"
    [ -f "${wheels[0]}" ] || { echo "install: no .whl/*.whl carried (bash benchmarks/fetch_gpu_wheels.sh)"; return 1; }
    for half in .big/a/cu13.partaa .big/b/cu13.partab; do [ -f "$half" ] && cp "$half" /tmp/; done
    if [ -f /tmp/cu13.partaa ] && [ -f /tmp/cu13.partab ]; then
        cat /tmp/cu13.partaa /tmp/cu13.partab > "$CU13" && wheels+=("$CU13")
    else
        echo "install: the cutlass cu13 halves are not both in /tmp (stage prep): flash-attn-4 will not import"
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}" || return 1
    gpu_line "$dir"
    python3 - <<'PY' 2>&1 | quiet | tee "$dir/versions.txt"
import importlib.metadata as md
import torch
print("python", __import__("platform").python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
for name in ("triton", "diffusers", "flash-attn-4", "sageattention", "nvidia-cutlass-dsl"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
try:
    from flash_attn.cute import flash_attn_func  # noqa: F401
    print("flash-attn-4 imports")
except Exception as exc:
    print("flash-attn-4 does not import:", type(exc).__name__, str(exc)[:200])
PY
    python3 -m ditgate.cli.main doctor > "$dir/doctor.txt" 2>&1 || tail -5 "$dir/doctor.txt"
}

stage_tests() {  # the tests marked gpu, then the kernel tests that run interpreted on a CPU, natively here
    local dir=$OUT/tests
    mkdir -p "$dir"
    timeout 360 python3 -m pytest -q -m gpu -rs --tb=short --junitxml "$dir/junit-gpu.xml" 2>&1 | quiet \
        | tee "$dir/pytest-gpu.txt" | tail -12
    timeout 180 python3 -m pytest -q --tb=short --junitxml "$dir/junit-kernels.xml" tests/test_quant_kernel.py \
        tests/test_fused_pooling.py 2>&1 | quiet | tee "$dir/pytest-kernels.txt" | tail -6
}

stage_kernels() {
    local dir=$OUT/kernels
    mkdir -p "$dir"
    gpu_line "$dir"
    # shellcheck disable=SC2086
    timeout 420 python3 -m ditgate.cli.main bench kernels --preset $KERNEL_SHAPES --warm 15 --out "$dir" 2>&1 \
        | quiet | tee "$dir/bench-kernels.log" | tail -40
}

stage_models() {  # the rows of the README's whole-forward table, per preset cut to its first blocks
    local dir=$OUT/models item preset blocks
    mkdir -p "$dir"
    gpu_line "$dir"
    for item in $MODELS; do
        preset=${item%%:*}; blocks=${item#*:}
        [ "$blocks" = "$item" ] && blocks=""
        echo "== $preset${blocks:+, $blocks blocks}"
        timeout "$EACH" python3 -m ditgate.cli.main bench model --preset "$preset" ${blocks:+--layers "$blocks"} \
            --backends native _native_cudnn --profiles quality speed --sparse 0.3 --sparse-static fp8_sparse \
            --rounds 3 --out "$dir" 2>&1 | quiet | tee "$dir/$preset.log" | tail -14
    done
}

stage_sparse() {  # the sparse forms at budget 0.3 (and 1.0 / 0.5 / 0.15), selected and window patterns
    local dir model
    for model in $SPARSE_MODELS; do
        dir=$OUT/sparse/$model
        mkdir -p "$dir"
        gpu_line "$dir"
        timeout 480 python3 benchmarks/sparse_attention.py --out "$dir" --models "$model" --patterns selected window \
            --skip-attach --consumers ditgate_fp8_hopper ditgate_fp8_hopper_192 ditgate_plain_hopper \
            ditgate_plain_hopper_192 fp8_sparse_form fp8_sparse_pooled block_sparse_form 2>&1 | quiet \
            | tee "$dir/sparse-attention.log" | grep -v "^{" | tail -30
        python3 benchmarks/plot_sparse.py "$dir/sparse-attention.json" > /dev/null 2>&1 || echo "(no plot: matplotlib?)"
    done
}

stage_lists() {
    local dir=$OUT/lists
    mkdir -p "$dir"
    gpu_line "$dir"
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$dir" --shapes ltx wan --kernel-only \
        --kernel-rounds 3 2>&1 | quiet | tee "$dir/fixed-costs.log" | grep -v "^{" | tail -24
}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
[ $# -gt 0 ] || usage
for stage in "$@"; do
    declare -F "stage_$stage" > /dev/null || { echo "unknown stage: $stage"; usage; }
done
mkdir -p "$OUT"
status=0
for stage in "$@"; do
    echo "==== $stage"
    "stage_$stage" || { status=$?; echo "stage $stage failed ($status)"; }
done
python3 benchmarks/summary.py "$OUT"
exit $status
