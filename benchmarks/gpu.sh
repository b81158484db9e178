#!/usr/bin/env bash
# ditgate's GPU benchmarks in a few stages that compose: `bash benchmarks/gpu.sh install tests kernels` runs three.
#
# The GPU machine has Python 3.12 and a CUDA torch but no network. What it lacks travels as wheels, fetched once on a
# machine with network by `bash benchmarks/fetch_gpu_wheels.sh`: .whl/ (diffusers, flash-attn-4 and its needs,
# sageattention), .whl2/ (fa3-fwd, 27.6 MB) and the 92 MB cutlass cu13 library wheel that flash-attn-4 needs, split
# into .big/a, .big/b and .big/c, because a call carries at most 64 MiB with the tree. /tmp outlives a call while the
# machine stays warm (about 30 s between calls), so a fresh machine takes, back to back:
#
#   bash benchmarks/gpu.sh prep                     (carry .big/a .whl)    into /tmp/carry
#   bash benchmarks/gpu.sh prep                     (carry .big/b)         into /tmp/carry
#   bash benchmarks/gpu.sh install tests kernels    (carry .big/c .whl2)   join, install, then the stages
#   bash benchmarks/gpu.sh calibration models       (no carry, same warm machine)
#
# Stages:
#   prep      copy whatever parts and wheels were carried to /tmp/carry
#   install   join the cutlass parts, pip install every carried wheel into /tmp/site, print the versions
#   overhead  the router's host-side cost per attention call (ditgate bench overhead, budget 30 us)
#   tests     the GPU tests (pytest -m gpu), then the kernel tests on CUDA
#   kernels   ditgate bench kernels at the attention shapes of real models ($KERNEL_SHAPES)
#   models    ditgate bench model, whole forwards: stock diffusers against ditgate's profiles and the sparse
#             stage, per "preset:blocks" in $MODELS, each under $EACH seconds
#   sparse    benchmarks/sparse_attention.py: the sparse forms against fa4 and cuDNN on activations captured
#             from the model classes, per preset in $SPARSE_MODELS
#   calibration  ditgate bench calibration: seconds and stock forwards per profile, the timing cache's second
#             process (SECOND_PROCESS=" " leaves it out, for a model whose build takes minutes), per "preset:blocks"
#             in $CALIBRATION (and the per-site gate beside it for $PER_SITE)
#   compiled  ditgate bench model with linear forms and torch.compile rows, per "preset:blocks" in $COMPILED, $ROUNDS rounds
#             ($COMPILED_ARGS replaces the rows asked for, e.g. "--profiles speed --compile default reduce-overhead")
#   linear    benchmarks/linear_parts.py: the FP8 linear forms' parts (quantization, row-wise and tensor-wise
#             products) against bf16 F.linear at Wan's and Flux's shapes
#   linear_eager  benchmarks/experiments/linear_eager_profile.py: an eager forward of $LINEAR_EAGER_PRESET with static
#             plans serving every per-token linear with one of $LINEAR_EAGER_FORMS (or gated: gate:FORM, gate-dt:FORM;
#             FORM:all for every role), against stock, and its profile
#             (LINEAR_EAGER_ARGS=--compile: both compiled; add --gaps for each forward's device idle time and kernel families)
#   parts     benchmarks/attention_parts.py: the 8-bit attention forms' parts (quantization, kernel, whole form;
#             fa3_fp8 with and without a site, so one read against two) per shape in $PARTS_SHAPES
#   memo      ditgate bench calibration of $MEMO_PRESET ($MEMO_ARGS) with a second process, Triton's key remembered and not
#             (DITGATE_TRITON_KEY_MEMO=1 / 0, or only those in $MEMO_MODES), each in fresh caches
#   accuracy  benchmarks/experiments/accuracy_check_cost.py: the gate's accuracy check per site, its one-read kernel
#             against its torch path, at Wan's and Flux's output sizes
#   lists     the Hopper kernel alone over FP8 block lists at densities 0.125-1 against dense, at LTX and Wan-14B
#             (benchmarks/experiments/fixed_costs.py): the bound of 1.15 x density x dense
# Each stage writes under $OUT/<stage>/ (JSON, PNG, logs) and the script ends with a short table of every result
# (benchmarks/summary.py); then $OUT holds results.tgz (all of it) and summary.txt, as the device tool returns 8 files. Every call is at most 10 minutes:
# the defaults keep each stage well inside that, one stage per call for models and sparse.
# To add a stage: a function stage_<name> that writes under "$OUT/<name>", and a line in the usage list above.
set -uo pipefail
OUT=${OUT:-ditgate-out}
SITE=/tmp/site
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD"
export PYTHONUNBUFFERED=1
CARRY=/tmp/carry
CU13=$CARRY/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
KERNEL_SHAPES=${KERNEL_SHAPES:-"flux-1024 image-8192-hd128 image-8192-hd64 ltx-1216x704x257 wan-14b-480p"}
KERNEL_FORMS=${KERNEL_FORMS:-"sdpa_cudnn fa4 fa3 fa3_fp8 fp8 int8"}
CALIBRATION=${CALIBRATION:-"wan-1.3b-480p-81f"}
PER_SITE=${PER_SITE:-"wan-1.3b-480p-81f:10 ltx-2b-1216x704x257:8"}
COMPILED=${COMPILED:-"wan-1.3b-480p-81f flux-dev-1024"}
COMPILED_ARGS=${COMPILED_ARGS:-"--profiles quality speed --linear --compile default"}
CALIBRATION_ARGS=${CALIBRATION_ARGS:-"--profiles quality speed --sparse 0.3"}
MODELS=${MODELS:-"wan-1.3b-480p-81f:10 ltx-2b-1216x704x257:8 flux-dev-1024:8"}
EACH=${EACH:-180}
PARTS_SHAPES=${PARTS_SHAPES:-"flux-1024 image-8192-hd128 image-8192-hd64"}
MEMO_PRESET=${MEMO_PRESET:-"wan-1.3b-480p-81f"}
MEMO_ARGS=${MEMO_ARGS:-"--profiles quality speed --sparse 0.3"}
SPARSE_MODELS=${SPARSE_MODELS:-"ltx-2b-1216x704x257"}  # wan-14b-480p-81f takes about 7 minutes alone
NOISE="aux_data\|exe_args\|Attention backends are\|float32\|Warn"  # Gluon and diffusers lines nobody reads

quiet() { grep -v "$NOISE"; }

gpu_line() {  # the GPU, its driver and clock, into the stage's folder
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$1/gpu.txt"
}

stage_prep() {
    mkdir -p "$CARRY"
    local f
    for f in .big/*/cu13.part* .whl*/*.whl; do  # .whl, .whl2, or any other .whl* folder carried
        [ -f "$f" ] && cp "$f" "$CARRY/" && echo "carried $f"
    done
    ls "$CARRY"
}

stage_install() {
    local dir=$OUT/install
    mkdir -p "$dir"
    stage_prep > /dev/null
    local parts=("$CARRY"/cu13.part*)
    if [ "${#parts[@]}" -ge 3 ]; then
        cat "${parts[@]}" > "$CU13" && rm -f "${parts[@]}"
    fi
    [ -f "$CU13" ] || echo "install: the cutlass cu13 parts are not all in $CARRY (stage prep): flash-attn-4 will not import"
    local wheels=("$CARRY"/*.whl)
    [ -f "${wheels[0]}" ] || { echo "install: no wheel carried (bash benchmarks/fetch_gpu_wheels.sh)"; return 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}" || return 1
    gpu_line "$dir"
    python3 - <<'PY' 2>&1 | quiet | tee "$dir/versions.txt"
import importlib.metadata as md
import torch
print("python", __import__("platform").python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
for name in ("triton", "diffusers", "flash-attn-4", "fa3-fwd", "sageattention", "nvidia-cutlass-dsl", "peft"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
for what, stmt in (("flash-attn-4", "from flash_attn.cute import flash_attn_func"), ("fa3-fwd", "import fa3_fwd")):
    try:
        exec(stmt)
        print(what, "imports")
    except Exception as exc:
        print(what, "does not import:", type(exc).__name__, str(exc)[:200])
PY
    python3 -m ditgate.cli.main doctor > "$dir/doctor.txt" 2>&1 || tail -5 "$dir/doctor.txt"
}

stage_tests() {  # the tests marked gpu, then the kernel tests that run interpreted on a CPU, natively here
    local dir=$OUT/tests
    mkdir -p "$dir"
    timeout ${TESTS_S:-360} python3 -m pytest -q -m gpu -rs --tb=short --junitxml "$dir/junit-gpu.xml" 2>&1 | quiet \
        | tee "$dir/pytest-gpu.txt" | tail -12
    timeout ${KERNEL_TESTS_S:-180} python3 -m pytest -q --tb=short --junitxml "$dir/junit-kernels.xml" tests/test_quant_kernel.py \
        tests/test_fused_pooling.py 2>&1 | quiet | tee "$dir/pytest-kernels.txt" | tail -6
}

stage_kernels() {
    local dir=$OUT/kernels
    mkdir -p "$dir"
    gpu_line "$dir"
    # shellcheck disable=SC2086
    timeout ${KERNELS_S:-420} python3 -m ditgate.cli.main bench kernels --preset $KERNEL_SHAPES --forms $KERNEL_FORMS --warm ${WARM:-15} \
        --out "$dir" 2>&1 \
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

stage_overhead() {
    local dir=$OUT/overhead
    mkdir -p "$dir"
    timeout 120 python3 -m ditgate.cli.main bench overhead --device cuda 2>&1 | quiet | tee "$dir/overhead.log" | tail -8
}

stage_calibration() {  # the gate's cost on full models; the per-site gate beside it where $PER_SITE names a model
    local dir=$OUT/calibration item preset blocks
    mkdir -p "$dir"
    gpu_line "$dir"
    for item in $CALIBRATION; do
        preset=${item%%:*}; blocks=${item#*:}; [ "$blocks" = "$item" ] && blocks=""
        echo "== $preset${blocks:+, $blocks blocks}: quality, speed, speed with sparse 0.3; a second process"
        timeout "$EACH" python3 -m ditgate.cli.main bench calibration --preset "$preset" ${blocks:+--layers "$blocks"} \
            $CALIBRATION_ARGS ${SECOND_PROCESS:---second-process} --out "$dir" 2>&1 | quiet | tail -16
    done
    for item in $PER_SITE; do
        preset=${item%%:*}; blocks=${item#*:}; [ "$blocks" = "$item" ] && blocks=""
        echo "== $preset${blocks:+, $blocks blocks}: the per-site gate and the shared one, the forms each chose"
        timeout "$EACH" python3 -m ditgate.cli.main bench calibration --preset "$preset" ${blocks:+--layers "$blocks"} \
            --profiles quality speed --per-site --out "$dir/per-site-$preset" 2>&1 | quiet | tail -16
    done
}

stage_compiled() {  # eager and compiled rows, with and without linear forms
    local dir=$OUT/compiled item preset blocks
    mkdir -p "$dir"
    gpu_line "$dir"
    for item in $COMPILED; do
        preset=${item%%:*}; blocks=${item#*:}; [ "$blocks" = "$item" ] && blocks=""
        echo "== $preset${blocks:+, $blocks blocks}"
        timeout "$EACH" python3 -m ditgate.cli.main bench model --preset "$preset" ${blocks:+--layers "$blocks"} \
            --backends native $COMPILED_ARGS --rounds ${ROUNDS:-3} \
            --out "$dir" 2>&1 \
            | quiet | tee "$dir/$preset.log" | tail -24
    done
}

stage_linear() {
    local dir=$OUT/linear
    mkdir -p "$dir"
    gpu_line "$dir"
    timeout ${LINEAR_S:-240} python3 benchmarks/linear_parts.py --out "$dir" 2>&1 | quiet | tee "$dir/linear-parts.log" \
        | tail -4
}

stage_linear_eager() {  # what an eager forward with linear forms spends its time on (the whole-model check's forwards)
    local dir=$OUT/linear_eager
    mkdir -p "$dir"
    gpu_line "$dir"
    # shellcheck disable=SC2086
    timeout ${LINEAR_EAGER_S:-360} python3 benchmarks/experiments/linear_eager_profile.py \
        --preset ${LINEAR_EAGER_PRESET:-flux-dev-1024} --layers ${LINEAR_EAGER_LAYERS:-8} \
        ${LINEAR_EAGER_FORMS:-fp8_linear fp8_delayed_linear} ${LINEAR_EAGER_ARGS:-} > "$dir/linear-eager.log" 2>&1
    grep "^==\|rror" "$dir/linear-eager.log" | tail -20  # the profiles are in the log
}

stage_parts() {  # the 8-bit attention forms' parts at image lengths (fa3_fp8's one-read path beside its two launches)
    local dir=$OUT/parts
    mkdir -p "$dir"
    gpu_line "$dir"
    timeout ${PARTS_S:-150} python3 benchmarks/attention_parts.py --out "$dir" --shapes $PARTS_SHAPES 2>&1 | quiet \
        | tee "$dir/attention-parts.log" | tail -20
}

stage_memo() {  # a second process's calibration with Triton's key remembered and without (DITGATE_TRITON_KEY_MEMO)
    local dir=$OUT/memo m
    mkdir -p "$dir"
    gpu_line "$dir"
    for m in ${MEMO_MODES:-1 0}; do
        DITGATE_TRITON_KEY_MEMO=$m DITGATE_CACHE_DIR=/tmp/memo-dc$m TRITON_CACHE_DIR=/tmp/memo-tc$m \
            timeout ${EACH} python3 -m ditgate.cli.main bench calibration --preset $MEMO_PRESET $MEMO_ARGS \
            --second-process --out "$dir/memo-$m" 2>&1 | quiet | tee "$dir/memo-$m.log" | tail -8
    done
}

stage_accuracy() {  # what the gate's accuracy check costs per site (kernels.accuracy_sums against torch ops)
    local dir=$OUT/accuracy
    mkdir -p "$dir"
    gpu_line "$dir"
    timeout ${ACCURACY_S:-120} python3 benchmarks/experiments/accuracy_check_cost.py 2>&1 | quiet \
        | tee "$dir/accuracy-check.log" | tail -8
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
python3 benchmarks/summary.py "$OUT" | tee /tmp/summary.txt
# the device tool returns at most 8 files: everything goes back as one archive, the summary beside it
tar czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz /tmp/summary.txt "$OUT/"
exit $status
