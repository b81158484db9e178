#!/usr/bin/env bash
# One entry for the lent GPU machine. Stages (the cutlass DSL wheel is split in two halves, 46 MB each,
# carried in two calls; /tmp survives between calls while the machine stays warm):
#   bash benchmarks/gpu.sh prep          (carry .big/a)        copy the first half to /tmp
#   bash benchmarks/gpu.sh main          (carry .whl .big/b)   join, install, GPU tests, Wan attach, kernels
#   bash benchmarks/gpu.sh quant         (carry .whl .big/b)   join, install, kernel tests, quant_kernel.py
#   bash benchmarks/gpu.sh models        (no carry)            bench model: Wan 1.3B 480p, LTX 768x512x121
#   bash benchmarks/gpu.sh kernels       (carry .whl .big/b)   join, install, GPU tests, kernel variants (TMA, warp spec.)
#   bash benchmarks/gpu.sh sparse        (carry .whl .big/b)   join, install, the sparse stage, fa4_sparse included
#   bash benchmarks/gpu.sh check-tall    (carry .whl .big/b)   join, install, GPU tests, then tall
#   bash benchmarks/gpu.sh selector      (no carry)            the tile selector's parts, timed alone
#   bash benchmarks/gpu.sh tall          (no carry)            fp8 / plain at 256- and 192-row query tiles
#   bash benchmarks/gpu.sh crossover     (no carry, warm)      the gate's choice at growing sequence lengths
#   bash benchmarks/gpu.sh hopper-first  (carry .whl)          no fa4: Hopper-schedule tests, then hopper_kernel.py
#   bash benchmarks/gpu.sh hopper        (carry .whl .big/b)   join, install; GPU tests; hopper_kernel.py vs fa4; sparse stage
#   bash benchmarks/gpu.sh final-s4      (carry .whl .big/b)   join, install; GPU tests; selector parts; sparse stage
#   bash benchmarks/gpu.sh s5-kernel     (carry .whl .big/b)   join, install; Hopper-schedule tests; hopper_kernel.py, schedules 0-2
#   bash benchmarks/gpu.sh s5-sparse     (no carry, warm)      GPU form tests; the sparse stage (Hopper FP8 consumer)
#   bash benchmarks/gpu.sh s5-ab         (carry .whl)          no fa4: schedules 1-4 (rescale late / early), plain and FP8; Hopper tests
#   bash benchmarks/gpu.sh s5-ncu        (no carry, warm)      Nsight Compute on the Hopper schedule, FP8 and plain
#   bash benchmarks/gpu.sh s6-groups     (carry .whl)          no fa4: three consumer warpgroups against two at LTX; tests
#   bash benchmarks/gpu.sh s6-final      (carry .whl .big/b)   join, install; tests/test_gpu.py; hopper_kernel.py, schedule 3
#   bash benchmarks/gpu.sh s7-prep       (carry .big/a)        keep the first half; Hopper tests of 128- and 192-row lists
#   bash benchmarks/gpu.sh s7-check      (carry .whl)          no fa4: tests/test_gpu.py (192-row lists through the forms); selector parts
#   bash benchmarks/gpu.sh join          (carry .big/b)        join the halves into /tmp (the tree, .whl and .big/b: > 64 MiB)
#   bash benchmarks/gpu.sh s7-final      (carry .whl)          install; tests/test_gpu.py; the sparse stage ($MODELS, default both)
#   bash benchmarks/gpu.sh s8-soft       (carry .whl)          no fa4: exp2s on the FMA units: tests, A/B per mode
#   bash benchmarks/gpu.sh s8-table      (carry .whl, after prep and join)  install; exp2s on the FMA units (tests,
#                                        A/B); the kernels against cuDNN and fa4 at both shapes, lists at the issue's densities
#   bash benchmarks/gpu.sh s8-wan        (carry .whl, after prep and join)  install; the sparse stage at Wan-14B
#   bash benchmarks/gpu.sh s10-persist   (carry .whl, at b973516)  no fa4: persistent programs against one per tile and
#                                        the kernel before (smoke run, then A/B)
#   bash benchmarks/gpu.sh s10-prep      (carry .big/a)        keep the first half; Hopper tests of this session's options
#   bash benchmarks/gpu.sh s10-final     (carry .whl, after s10-prep and join)  install; every mode against cuDNN and
#                                        fa4, lists at LTX; the forms' GPU tests
#   bash benchmarks/gpu.sh s11-bytes     (carry .whl)          no fa4: P's FP8 bytes without exp2 (byte_p): tests, A/B
#   bash benchmarks/gpu.sh s11-final     (carry .whl, after prep and join)  install; every mode against cuDNN and fa4,
#                                        lists at LTX; Hopper and forms' GPU tests
#   bash benchmarks/gpu.sh s11-sparse    (no carry, warm after s11-final)  the sparse stage ($MODELS, default LTX)
#   bash benchmarks/gpu.sh s11-wan-lists (carry .whl)          no fa4: the sparse stage at Wan-14B (FP8 lists of 128 rows
#                                        with byte_p on the Hopper schedule against Triton's); the forms' GPU tests
#   bash benchmarks/gpu.sh s10-tree      (carry .whl)          no fa4: row max as a tree or a chain (A/B, bits compared)
#   bash benchmarks/gpu.sh s10-probe     (carry .whl)          no fa4: INT8 narrow A/B; Nsight Compute stalls per SASS line
#   bash benchmarks/gpu.sh s9-check      (carry .whl)          no fa4: Hopper and forms' GPU tests; FP8 lists with tc_sum A/B
#   bash benchmarks/gpu.sh s9-final      (carry .whl, after prep and join)  install; FP8 and INT8 (defaults) against cuDNN, fa4
#   bash benchmarks/gpu.sh s9-tcsum      (carry .whl)          no fa4: row sums on the tensor cores or not (tests, A/B)
#   bash benchmarks/gpu.sh s9-keys       (carry .whl)          no fa4: 256 key rows per stage against 128 (tests, A/B)
#   bash benchmarks/gpu.sh s8-pin        (carry .whl)          no fa4: exp2s pinned above the P·V wait or not (A/B), tests
#   bash benchmarks/gpu.sh s8-prep       (carry .big/a)        keep the first half; the selector's kernels against an
#                                        alternative (A/B, selector_ab.py); pinned list tests
#   bash benchmarks/gpu.sh s8-final      (carry .whl, after s8-prep and join)  install; GPU tests of the forms; the
#                                        sparse stage at LTX; FP8 against cuDNN and fa4 at LTX
#   bash benchmarks/gpu.sh s12-pool      (carry .whl, after prep and join)  install; the sparse stage with the FP8 form
#                                        pooling for its selection or not; fixed costs; the new GPU tests
#   bash benchmarks/gpu.sh s12-final     (carry .whl, after prep and join)  install; the list loads ahead of the stage
#                                        wait against the kernel before (A/B); fixed costs; the sparse stage; GPU tests
#   bash benchmarks/gpu.sh s13-lists     (carry .whl)          no fa4: list tests, FP8 lists against aafbab4's kernel, fixed costs
#   bash benchmarks/gpu.sh s13-quant     (carry .whl)          no fa4: quantization in three launches: tests; host_costs.py
#                                        against the five launches before; quantize_kernels.py; fixed costs
#   bash benchmarks/gpu.sh s13-final     (carry .whl)          no fa4: K and V in two launches at head dim 128: tests; host_costs.py
#                                        (kept or remade descriptors; quantize against aafbab4's); quantize_kernels.py
#   bash benchmarks/gpu.sh s13-parts     (carry .whl)          no fa4: K and V compiled apart at head dim 128 (PART): tests;
#                                        quantize_kernels.py; quantize against aafbab4's (host_costs.py, one round)
#   bash benchmarks/gpu.sh s13-ltx       (carry .whl, after prep and join)  install; the sparse stage at LTX with fa4
#                                        alongside (selected and window; FP8 and plain, 192-row lists)
#   bash benchmarks/gpu.sh s13-scales    (carry .whl)          no fa4: K's mean and V's scales in one step per program:
#                                        tests; quantize_kernels.py; quantize against e5f3a86's (host_costs.py, LTX)
#   bash benchmarks/gpu.sh s13-host      (carry .whl)          no fa4: descriptors kept by the workspace (tests); the host's
#                                        share of the FP8 calls, kept or remade (host_costs.py); the forms' GPU tests
#   bash benchmarks/gpu.sh s12-quant     (carry .whl)          no fa4: the quantization passes one by one at 4 and 8 warps;
#                                        the Hopper list tests (schedule 3) and the forms' GPU tests
#   bash benchmarks/gpu.sh s12-table     (carry .whl, after prep and join)  install; every 8-bit mode against cuDNN and
#                                        fa4 (lists at LTX); the sparse stage at both shapes, the form pooling or not
#   bash benchmarks/gpu.sh s12-whole     (carry .whl)          no fa4: the FP8 sparse form's whole call, the selector
#                                        pooling or the quantization pooling, interleaved rounds (fixed_costs.py)
#   bash benchmarks/gpu.sh s14-lazy      (carry .whl)          no fa4: the output rescaled only where a row's max moved
#                                        (lazy): tests, A/B (pin_ab.py); V's store in order (call a also timed 1, 2, 4 Q blocks per program)
#                                        (quantize_kernels.py against d531867's quant_attention, written beside it)
#   bash benchmarks/gpu.sh s14-lazytest  (carry .whl)          no fa4: the lazy rescale's GPU tests; with QUANT_PARTS=1
#                                        quantize_kernels.py at 2, 4 and 8 warps
#   bash benchmarks/gpu.sh s14-warps     (carry .whl)          no fa4: the first pass at two warps: tests; quantize_kernels.py
#                                        against d531867's quant_attention (written beside it)
#   bash benchmarks/gpu.sh s14-ltx       (carry .whl, after prep and join)  install; at LTX, FP8 and INT8 against cuDNN
#                                        and fa4 (pin_ab.py, lazy or not); the sparse stage with fa4 alongside
#   bash benchmarks/gpu.sh s14-fixed     (carry .whl)          no fa4: fixed_costs.py (lists at the issue's densities,
#                                        dense with lazy on and off)
#   bash benchmarks/gpu.sh s14-ncu       (carry .whl)          no fa4: Nsight Compute stall samples, FP8 at LTX, dense
#                                        against lists of every block (NCU_RUNS: other runs, e.g. all 32 heads)
#   bash benchmarks/gpu.sh s14-bits      (carry .whl)          no fa4: the quantized copies, first pass at two warps
#                                        against four
#   bash benchmarks/gpu.sh s14-final     (carry .whl, after prep and join)  install; GPU tests (lazy rescale, lists,
#                                        forms); FP8 and INT8 against cuDNN and fa4, lazy or not (pin_ab.py); the
#                                        sparse stage at LTX with fa4 alongside
#   bash benchmarks/gpu.sh s15-fixed     (carry .whl)          no fa4: fixed_costs.py at LTX, short lists, variants ($VARIANTS)
#   bash benchmarks/gpu.sh s15-ordered   (carry .whl)          no fa4: GPU tests of the Hopper kernel; fixed_costs.py ($VARIANTS:
#                                        call c of results s15 compared knobs since removed, order_channels and wide_stores)
#   bash benchmarks/gpu.sh s15-final     (carry .whl, after prep and join)  install; Hopper GPU tests; FP8 and INT8 against
#                                        cuDNN and fa4 (pin_ab.py); fixed_costs.py at the issue's densities; the sparse
#                                        stage at LTX ($PARTS: any of tests ab fixed sparse, default all)
#   bash benchmarks/gpu.sh s15-profile   (carry .whl)          no fa4: the FP8 sparse form's whole call, kernel by kernel
#                                        (sparse_call_profile.py), and back to back (fixed_costs.py --whole-only)
#   bash benchmarks/gpu.sh s15-wan       (carry .whl, after prep and join)  install; the sparse stage at Wan-14B, fa4
#                                        alongside (the FP8 consumers over 128-row lists, the form's whole call, plain)
#   bash benchmarks/gpu.sh s15-tests     (carry .whl)          no fa4: the GPU tests the timeouts of calls c and d cut short
#   bash benchmarks/gpu.sh s16-ab        (carry .whl)          no fa4: INT8's row max over the integers (tests, A/B); the
#                                        quantization with heads varying fastest against HEAD's; the FP8 sparse call profiled
#   bash benchmarks/gpu.sh s16-probe     (carry .whl)          no fa4: INT8 GPU tests; Nsight Compute at Wan-14B, FP8 dense
#                                        against every block listed
#   bash benchmarks/gpu.sh s16-ahead     (carry .whl)          no fa4: four list indices in flight in the load partition:
#                                        tests, the kernel alone over lists (A/B)
#   bash benchmarks/gpu.sh s16-beside    (carry .whl)          no fa4: K and V quantized beside the selection on a second
#                                        stream: tests, the FP8 sparse call's whole time (A/B)
#   bash benchmarks/gpu.sh s17-plain     (carry .whl)          no fa4: plain mode's lazy rescale and gathered output stores
#                                        (tests, the kernel alone over lists at LTX), the sparse calls kernel by kernel
#   bash benchmarks/gpu.sh s17-profile   (carry .whl)          no fa4: GPU tests ($TESTS), the sparse calls kernel by kernel
#   bash benchmarks/gpu.sh s17-urgent    (carry .whl)          no fa4: the FP8 sparse call's selection at the highest priority
#   bash benchmarks/gpu.sh s17-choose    (carry .whl)          no fa4: the selector's choosing kernel per warp count
#   bash benchmarks/gpu.sh s17-final     (carry .whl)          after prep and join: the sparse stage at LTX (SHAPE=wan: Wan-14B)
#   bash benchmarks/gpu.sh s18-order     (carry .whl)          no fa4: the passes' programs heads inner against heads outer
#   bash benchmarks/gpu.sh s18-onecall   (carry .whl)          no fa4: the sparse calls profiled one at a time
#   bash benchmarks/gpu.sh s18-means     (carry .whl)          no fa4: Q's and K's tile means in one launch, tested and profiled
#   bash benchmarks/gpu.sh s19-model     (carry .whl, after prep and join)  install; bench model on $PRESET (default
#                                        LTX 2B at 27588 tokens) cut to $LAYERS blocks (default 8): stock, quality, speed,
#                                        speed with the sparse stage at $BUDGET (default 0.3), fp8_sparse and block_sparse static;
#                                        the GPU's busy share of one forward per row; first (unless NO_TESTS=1)
#                                        the Hopper lists over keys that end before the queries (HunyuanVideo's);
#                                        PRESET=wan-14b-480p-81f, or hunyuan-video-544x960x129 with LAYERS=2 (its
#                                        masked joint attention served unmasked over the keys before the padding),
#                                        wan-animate-14b-720p-77f with LAYERS=5 (75600 tokens, the reference frame
#                                        dense), kandinsky5-lite-768x512x121 or framepack-720p-9f with LAYERS=2,
#                                        wan22-ti2v-5b-1280x704x121 (its starting frame dense),
#                                        hunyuan-video15-848x480x121 with LAYERS=4 (its square padding mask cut)
#   bash benchmarks/gpu.sh s20-presets   (carry .whl, after prep and join)  install; the s19-model rows (no GPU-busy
#                                        pass, $ROUNDS default 2) on each of $PRESETS ("preset:layers ...", default the
#                                        families verified in session 20), one after another, each under $EACH seconds
#                                        (default 150), each into $OUT/<preset>
# The wheels: bash benchmarks/fetch_gpu_wheels.sh (on a machine with network).
set -uo pipefail
stage=${1:?stage}
OUT=${OUT:-ditgate-out}
mkdir -p "$OUT"
SITE=/tmp/site
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$PWD"
export PYTHONUNBUFFERED=1
CU13=/tmp/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
install() {  # join the two halves of the cutlass cu13 wheel (first half left in /tmp by prep; or joined already by
    # `join`, when the working tree with .whl and .big/b together is over the 64 MiB a call carries), install all wheels
    if [ -f .big/b/cu13.partab ]; then cat /tmp/cu13.partaa .big/b/cu13.partab > "$CU13"; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/*.whl "$CU13" || exit 1
    touch "$SITE/.with-cu13"  # what the stages that skip a repeated install look for (install_small leaves fa4 unusable)
}
smoke() {  # one small call per mode and schedule ($@, default 0 1 2), under a short timeout: a deadlock stops here;
    # HEAD_DIM (default 128) and GROUPS (consumer warpgroups to try, default the head dim's own) from the environment
    SCHEDULES="${*:-0 1 2}" timeout 120 python3 - <<'PY' 2>&1 | tail -30
import os
import torch
from ditgate.kernels.hopper_attention import hopper_attention
d = int(os.environ.get("HEAD_DIM", "128"))
q = torch.randn(1, 1000, 2, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
ref = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float())
for schedule in map(int, os.environ["SCHEDULES"].split()):
    for groups in [int(g) for g in os.environ.get("GROUPS", "").split()] or [None]:
        for qk in ("plain", "fp8", "int8"):
            out = hopper_attention(q, q, q, qk=qk, schedule=schedule, groups=groups)
            torch.cuda.synchronize()
            print(schedule, groups, qk, "rel", ((out.float() - ref).norm() / ref.norm()).item(), flush=True)
PY
    return "${PIPESTATUS[0]}"
}
sparse_ltx() {  # the sparse stage at LTX, selected and window, the 192-row consumers and the FP8 forms; the last $1 lines
    timeout 240 python3 benchmarks/sparse_attention.py --out "$OUT" --models ltx-2b-1216x704x257 \
        --patterns selected window --skip-attach --consumers ditgate_fp8_hopper_192 fp8_sparse_form fp8_sparse_pooled \
        ditgate_plain_hopper_192 block_sparse_form 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -"$1"
}
ncu_runs() {  # Nsight Compute on ncu_target.py's FP8 launch at shape $2 for each run of $1 ("name options;...")
    IFS=';' read -ra runs <<< "$1"
    local shape=$2
    for run in "${runs[@]}"; do
        set -- $run
        name=$1; shift
        timeout 120 ncu --clock-control none -k regex:_hopper_attn_kernel -c 1 --section WarpStateStats \
            --section SourceCounters --section SpeedOfLight -f -o "/tmp/ncu-$name" \
            python3 benchmarks/ncu_target.py fp8 "$shape" "$@" > "$OUT/ncu-$name.log" 2>&1 || tail -5 "$OUT/ncu-$name.log"
        ncu -i "/tmp/ncu-$name.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$name.csv" 2> "$OUT/sass-$name.err"
        ncu -i "/tmp/ncu-$name.ncu-rep" --page details > "$OUT/ncu-$name.txt" 2>&1
        grep -i "duration\|issue slots busy\|eligible warps\|cycles per issued" "$OUT/ncu-$name.txt" | head -6
    done
    python3 benchmarks/experiments/ncu_stalls.py "$OUT"/sass-*.csv 2>&1 | tee "$OUT/stalls.txt" | head -60
    gzip -f "$OUT"/sass-*.csv
}
install_small() {  # every wheel but the cutlass cu13 libraries (no fa4)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
}
case "$stage" in
s14-final)  # carry .whl, after prep and join
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_gpu.py -k "not test_hopper_kernel.py or lazy \
        or (lists_equal and schedule3) or p_bytes_over or (matches_reference and schedule3 and not plain)" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest.txt"
    timeout 150 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --rounds 2 --modes fp8 int8 \
        --variants default lazy=0 --list-lengths 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -22
    sparse_ltx 30
    ;;
s14-ltx)  # carry .whl, after prep and join: the session's final code at LTX, fa4 alongside: FP8 and INT8 (lazy or
    # not) against cuDNN and fa4; the sparse stage
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 120 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --rounds 2 --shapes ltx --modes fp8 int8 \
        --variants default lazy=0 --list-lengths 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -12
    sparse_ltx 30
    ;;
s14-ncu)  # carry .whl (no fa4): Nsight Compute's stall samples per SASS instruction, FP8 at LTX (6 heads), dense and
    # over lists of every block in order (the same blocks, in the same order, as dense); NCU_RUNS replaces the two runs
    # (name and ncu_target.py options, runs apart by ';'), NCU_SHAPE the shape (ltx or wan)
    install_small
    ncu_runs "${NCU_RUNS:-dense;lists216 --lists 216}" "${NCU_SHAPE:-ltx}"
    ;;
s16-probe)  # carry .whl (no fa4): the INT8 paths' GPU tests (the integer row max now on by default); Nsight Compute at
    # Wan-14B (8 heads), FP8 dense against every one of the 256 key blocks listed in order
    install_small
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_gpu.py -k "(matches_reference and schedule3 \
        and int8) or (three_warpgroups and int8) or (lists_equal and schedule3 and int8) or cuda_forms" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    ncu_runs "dense;lists256 --lists 256" wan
    ;;
s14-bits)  # carry .whl (no fa4): the quantized copies with the first pass at two warps against four, field by field
    install_small
    timeout 120 python3 - <<'PY' 2>&1 | tail -16 | tee "$OUT/first-pass-bits.txt"
import torch
from ditgate.kernels import hopper_attention as ha, quant_attention as qa
for h, s, d in ((32, 27588, 64), (40, 32760, 128)):
    q, k, v = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    made = {}
    for warps in (2, 4):
        qa.FIRST_PASS_WARPS = warps
        z = ha.quantize_for_schedule(q, k, v, "fp8", d ** -0.5, sums=True)
        made[warps] = {f: getattr(z, f).view(torch.uint8) if getattr(z, f).dtype == torch.float8_e4m3fn
                       else getattr(z, f) for f in ("q", "q_scale", "k", "k_scale", "vt", "v_scale", "k_sums", "q_sums")}
    for f, a in made[2].items():
        b = made[4][f]
        same = torch.equal(a, b)
        print(h, s, d, f, "same" if same else f"differ: {(a != b).sum().item()} of {a.numel()}")
PY
    ;;
s15-tests)  # carry .whl (no fa4): the forms' GPU tests and the Hopper list tests, each run to its summary line
    install_small
    timeout 150 python3 -m pytest -q tests/test_gpu.py -k "sparse_forms_equal or cuda_forms" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-forms.txt"
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "lists_equal and schedule3" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-lists.txt"
    ;;
s15-wan)  # carry .whl, after prep and join: the sparse stage at Wan-14B with fa4 alongside
    [ -f "$SITE/.with-cu13" ] || install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 420 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f --patterns selected window \
        --skip-attach --consumers ditgate_fp8_hopper fp8_sparse_form fp8_sparse_pooled ditgate_plain_hopper \
        block_sparse_form 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -30
    ;;
s15-profile)  # carry .whl (no fa4): where the FP8 sparse form's whole call spends the GPU's time, two ways of pooling
    install_small
    timeout 200 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ${SHAPES:-ltx} 2>&1 \
        | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -40
    timeout 150 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ${SHAPES:-ltx} --whole-only \
        --whole-rounds 3 2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -8
    ;;
s15-final)  # carry .whl, after prep and join (install skipped where a stage of this machine installed already)
    [ -f "$SITE/.with-cu13" ] || install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    parts=" ${PARTS:-tests ab fixed sparse} "
    if [[ $parts == *" tests "* ]]; then
        timeout 120 python3 -m pytest -q tests/test_hopper_kernel.py -k "(matches_reference and schedule3 and not plain) \
            or (lists_equal and schedule3)" --tb=line 2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    fi
    if [[ $parts == *" ab "* ]]; then
        timeout 150 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --rounds 2 --modes fp8 int8 --variants default \
            --list-lengths 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -14
    fi
    if [[ $parts == *" fixed "* ]]; then
        timeout 120 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --kernel-only --kernel-rounds 2 2>&1 \
            | tee "$OUT/fixed-costs.log" | grep -v "^{" | grep "median\|fit\|over dense" | tail -30
    fi
    if [[ $parts == *" sparse "* ]]; then
        sparse_ltx 30
    fi
    ;;
s15-ordered)  # carry .whl (no fa4): the Hopper kernel's GPU tests; the kernel alone, V's channels ordered or not
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 240 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_gpu.py -k "(matches_reference and schedule3) \
        or three_warpgroups or (lists_equal and schedule3) or p_bytes_over or selectors_sums or lists_of_one_slot \
        or kept_descriptors or lazy or sparse_forms_equal or cuda_forms" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args\|Warn\|warn" | tail -8 | tee "$OUT/pytest.txt"
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ${SHAPES:-ltx wan} --kernel-only \
        --blocks ${BLOCKS:-0 1 8 27 54} --variants ${VARIANTS:-default} --kernel-rounds ${ROUNDS:-3} \
        2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -60
    ;;
s16-ab)  # carry .whl (no fa4): INT8's row max over the integers (GPU tests: the same bits; pin_ab.py A/B) and the
    # quantization passes with heads varying fastest against the module file quant_attention_before.py beside
    # quantize_kernels.py (HEAD's, written there untracked: see quantize_kernels.py); the FP8 sparse call kernel by kernel.
    # Call a of results 2026-12-04-h200-s16 ran it; the heads-first order was removed after it (no gain)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 240 python3 -m pytest -q tests/test_hopper_kernel.py -k "int8_row_max or (p_bytes_without_exp2 and int8)" \
        --tb=line 2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 200 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --rounds 3 --modes int8 \
        --variants int_max=0 int_max=1 --list-lengths 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -12
    timeout 150 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" --warps 2 4 \
        --before benchmarks/experiments/quant_attention_before.py 2>&1 | tee "$OUT/quantize-kernels.log" | grep -v "^{" \
        | tail -24
    timeout 90 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ltx 2>&1 \
        | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -14
    ;;
s16-ahead)  # carry .whl (no fa4): four list indices in flight in the load partition (ahead): GPU tests (the same bits),
    # then the kernel alone over lists at the issue's densities, 0.3 and 1, against one in flight (fixed_costs.py).
    # Call d of results 2026-12-04-h200-s16 ran it; the option and its test were removed after it (no gain)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "four_list_indices" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ltx wan --kernel-only \
        --variants default ahead=1 --kernel-rounds 3 2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" \
        | grep "median\|fit\|over dense\|same" | tail -40
    ;;
s17-plain)  # carry .whl (no fa4): plain mode at LTX: GPU tests of the lazy rescale and the gathered output stores, the
    # kernel alone over lists (27 / 65 / 108 blocks) and dense per variant, then the bf16 and FP8 sparse calls kernel by kernel
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py -k "(lazy and plain) or gathered" --tb=short 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -15 | tee "$OUT/pytest.txt"
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --mode plain --shapes ltx --kernel-only \
        --blocks 27 65 108 --kernel-rounds 3 --variants ${VARIANTS:-default gather_out=1 lazy=1 gather_out=1,lazy=1} 2>&1 \
        | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -40
    timeout 90 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ltx 2>&1 \
        | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -40
    ;;
s17-profile)  # carry .whl (no fa4): the plain kernel's GPU tests with the gathered stores and the lazy rescale on by
    # default; the sparse calls kernel by kernel, with one call's timeline
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 360 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_gpu.py -k "${TESTS:-(plain and (three_warpgroups \
        or lists_equal or lazy or lists_of_one)) or gathered or sparse_forms_equal or cuda_forms}" --tb=short 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -15 | tee "$OUT/pytest.txt"
    timeout 200 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ${SHAPES:-ltx wan} 2>&1 \
        | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -90
    ;;
s17-urgent)  # carry .whl (no fa4): the FP8 sparse call with its first pass and selection on a high-priority stream
    # (fixed_costs.whole_call_variants), kernel by kernel with one call's timeline, then do_bench A/B rounds. Call f of
    # results 2026-12-04-h200-s17 ran it; that way was removed after it (no gain)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ltx 2>&1 \
        | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | grep "beside\|first start" | tail -40
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ltx wan --whole-only \
        --whole-rounds ${ROUNDS:-4} 2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -34
    ;;
s17-choose)  # carry .whl (no fa4): the selector's choosing kernel per warp count (choose_warps.py)
    install_small
    timeout 120 python3 benchmarks/experiments/choose_warps.py --out "$OUT" 2>&1 | tee "$OUT/choose-warps.log" | tail -40
    ;;
s18-order)  # carry .whl (no fa4): the passes over the host's Q, K, V with their programs heads inner against heads outer
    # (program_order.py), after the GPU tests that run them
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_gpu.py -k "${TESTS:-second_stream or \
        two_streams or copies_made_with or cuda_forms or sparse_forms_equal or selectors_kernel}" --tb=short 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -15 | tee "$OUT/pytest.txt"
    timeout 300 python3 benchmarks/experiments/program_order.py --out "$OUT" --rounds ${ROUNDS:-3} ${ORDER_ARGS:-} 2>&1 \
        | tee "$OUT/program-order.log" | grep -v "^{" | tail -30
    ;;
s18-onecall)  # carry .whl (no fa4): the sparse calls kernel by kernel, one at a time (a synchronize after each), at
    # $SHAPES (default wan): where the one-call timing's extra time goes
    install_small
    timeout 300 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ${SHAPES:-wan} --calls 10 \
        --one-at-a-time 2>&1 | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -80
    [ -z "${HOST_PROFILE:-}" ] || timeout 200 python3 benchmarks/experiments/host_profile.py --out "$OUT" \
        --shapes ${SHAPES:-wan} 2>&1 | tail -8
    ;;
s18-means)  # carry .whl (no fa4): Q's and K's tile means in one launch: test_fused_pooling.py on the GPU, then the
    # sparse calls profiled one at a time at LTX
    install_small
    timeout 120 python3 -m pytest -q tests/test_fused_pooling.py --tb=short 2>&1 | tail -3 | tee "$OUT/pytest.txt"
    timeout 150 python3 benchmarks/experiments/sparse_call_profile.py --out "$OUT" --shapes ltx --calls 10 \
        --one-at-a-time 2>&1 | tee "$OUT/sparse-call-profile.log" | grep -v "^{" | tail -50
    ;;
s19-model)  # carry .whl, after prep and join: a whole forward of the model with the sparse stage, against stock diffusers
    # and ditgate's dense profiles, fa4 among the forms the gate measures
    [ -f "$SITE/.with-cu13" ] || install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    [ -n "${NO_TESTS:-}" ] || timeout 120 python3 -m pytest -q tests/test_hopper_kernel.py -k "keys_that_end_before" \
        --tb=short 2>&1 | grep -v "aux_data\|exe_args" | tail -8 | tee "$OUT/pytest.txt"
    timeout ${LIMIT:-540} python3 -m ditgate.cli.main bench model --preset ${PRESET:-ltx-2b-1216x704x257} \
        --layers ${LAYERS:-8} --backends native _native_cudnn --profiles quality speed --sparse ${BUDGET:-0.3} \
        --sparse-static fp8_sparse block_sparse --rounds ${ROUNDS:-3} --gpu-busy --out "$OUT" 2>&1 \
        | tee "$OUT/bench-model.log" | grep -v "aux_data\|exe_args\|Attention backends are" | tail -40
    ;;
s20-presets)  # carry .whl, after prep and join: whole forwards of the families whose layouts session 20 verified
    [ -f "$SITE/.with-cu13" ] || install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    for item in ${PRESETS:-wan-animate-14b-720p-77f:5 wan22-ti2v-5b-1280x704x121:4 framepack-720p-9f:2 \
                 kandinsky5-lite-768x512x121:4 hunyuan-video15-848x480x121:4}; do
        preset=${item%%:*}; layers=${item##*:}
        mkdir -p "$OUT/$preset"
        echo "== $preset, $layers blocks"
        timeout ${EACH:-150} python3 -m ditgate.cli.main bench model --preset "$preset" --layers "$layers" \
            --backends native _native_cudnn --profiles quality speed --sparse ${BUDGET:-0.3} \
            --sparse-static fp8_sparse block_sparse --rounds ${ROUNDS:-2} --out "$OUT/$preset" 2>&1 \
            | tee "$OUT/$preset/bench-model.log" | grep -v "aux_data\|exe_args\|Attention backends are" | tail -14
    done
    ;;
s17-final)  # carry .whl, after prep and join: the selector's GPU test, then the sparse stage at LTX with fa4 alongside
    # (SHAPE=wan: at Wan-14B instead, as s15-wan)
    [ -f "$SITE/.with-cu13" ] || install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 100 python3 -m pytest -q tests/test_gpu.py -k "selectors_kernel" --tb=short 2>&1 | tail -2 \
        | tee "$OUT/pytest.txt"
    if [ "${SHAPE:-ltx}" = wan ]; then
        timeout 420 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f --patterns selected \
            window --skip-attach --consumers ditgate_fp8_hopper fp8_sparse_form fp8_sparse_pooled ditgate_plain_hopper \
            block_sparse_form 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
            | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -30
    else
        sparse_ltx 30
    fi
    ;;
s16-beside)  # carry .whl (no fa4): K and V quantized on a second stream beside the selection (kv_beside_selection):
    # GPU tests (the same bits), then the FP8 sparse form's whole call at budget 0.3 three ways, interleaved rounds
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "second_stream" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 300 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ltx wan --whole-only \
        --whole-rounds ${ROUNDS:-4} 2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -30
    ;;
s15-fixed)  # carry .whl (no fa4): the kernel alone over short lists at LTX, per variant, to see the per-program cost
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 400 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --shapes ${SHAPES:-ltx} --kernel-only \
        --blocks ${BLOCKS:-0 1 2 4 8 16 27 54} --variants ${VARIANTS:-default vs_early=1} --kernel-rounds ${ROUNDS:-3} \
        2>&1 | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -45
    ;;
s14-fixed)  # carry .whl (no fa4): the kernel alone over lists at the issue's densities against dense, lazy or not
    install_small
    timeout 150 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" 2>&1 | tee "$OUT/fixed-costs.log" \
        | grep -v "^{" | tail -30
    ;;
s14-warps)  # carry .whl (no fa4): the first pass at two warps: the tests that read the copies; quantize_kernels.py
    install_small
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_fused_pooling.py \
        -k "not test_hopper_kernel.py or (matches_reference and schedule3 and not plain) or selectors_sums or quantize" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 100 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" --warps 4 \
        --before benchmarks/experiments/quant_attention_before.py 2>&1 | grep -v "^{" | tail -24
    ;;
s14-lazytest)  # carry .whl (no fa4): the lazy rescale's GPU tests alone, with their failures' lines; then the
    # quantization's passes at 2, 4 and 8 warps, the first pass's Q and K/V programs also timed apart
    install_small
    timeout 240 python3 -m pytest -q tests/test_hopper_kernel.py -k "lazy" --tb=line 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -30 | tee "$OUT/pytest.txt"
    if [ -n "${QUANT_PARTS:-}" ]; then
        timeout 120 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" --warps 2 4 8 2>&1 | grep -v "^{" \
            | tail -40
    fi
    ;;
s14-lazy)  # carry .whl (no fa4)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py -k "lazy or (p_bytes and (odd or d128 or gqa)) or quantize" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest.txt"
    timeout 100 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" \
        --before benchmarks/experiments/quant_attention_before.py 2>&1 | grep -v "^{" | tail -36
    timeout 240 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --rounds 2 --modes fp8 int8 --variants lazy=0 lazy=1 \
        --list-lengths 27 65 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -30
    ;;
s8-prep)  # carry .big/a (call b of results s8 carried the tree's kernels as a "before" module: see selector_ab.py)
    cp .big/a/cu13.partaa /tmp/
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 benchmarks/experiments/selector_ab.py --out "$OUT" 2>&1 | tee "$OUT/selector-ab.log" \
        | grep -v "^{" | tail -22
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "lists and plain" 2>&1 | tail -3 \
        | tee "$OUT/pytest-hopper.txt"
    ;;
s8-final)  # carry .whl after s8-prep and join
    install
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 200 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -6 | tee "$OUT/pytest-gpu.txt"
    timeout 260 python3 benchmarks/sparse_attention.py --out "$OUT" --models ${MODELS:-ltx-2b-1216x704x257} 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | grep -v "radial\|window" | tail -30
    timeout 90 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --shapes ltx --modes fp8 --rounds 1 --list-lengths \
        2>&1 | tail -6
    ;;
s8-soft)  # carry .whl (no fa4): exp2s on the FMA units (soft_exp2, only at commit 02611ce), A/B against all on MUFU
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 100 python3 -m pytest -q tests/test_hopper_kernel.py -k "soft and d64" 2>&1 | tail -3 | tee "$OUT/pytest-hopper.txt"
    timeout 200 python3 benchmarks/experiments/pin_ab.py --out "$OUT/plain" --modes plain --list-lengths 65 \
        --variants soft_exp2=0 soft_exp2=8 2>&1 | tee "$OUT/soft-ab-plain.log" | grep -v "^{" | tail -14
    timeout 120 python3 benchmarks/experiments/pin_ab.py --out "$OUT/fp8" --modes fp8 --schedules 1 --list-lengths \
        --variants soft_exp2=0 soft_exp2=8 2>&1 | tee "$OUT/soft-ab-fp8.log" | grep -v "^{" | tail -12
    timeout 80 python3 benchmarks/experiments/pin_ab.py --out "$OUT/int8" --shapes ltx --modes int8 --list-lengths \
        --variants soft_exp2=0 soft_exp2=8 2>&1 | tee "$OUT/soft-ab-int8.log" | grep -v "^{" | tail -8
    ;;
s8-wan)  # carry .whl after prep and join: the sparse stage at Wan-14B, fa4 alongside
    install
    timeout 330 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -40
    ;;
s8-table)  # carry .whl after prep and join
    install
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 400 python3 benchmarks/hopper_kernel.py --out "$OUT" --schedules 3 --no-triton 2>&1 | tee "$OUT/hopper-kernel.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -30
    ;;
s10-persist)  # carry .whl (no fa4), at commit b973516 (the persistent option was removed after it lost): persistent
    # programs (one per multiprocessor, tiles in turn) against one program per tile and against the kernel before
    # this change (commit 6ba2e7c, written to
    # benchmarks/experiments/hopper_attention_before.py, untracked): a smoke run under a timeout, then A/B
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 240 python3 - <<'PY' 2>&1 | grep -v "aux_data\|exe_args" | tail -20 || exit 4
import torch
from ditgate.kernels.hopper_attention import hopper_attention
g = torch.Generator(device="cuda").manual_seed(3)
for qk in ("plain", "fp8", "int8"):
    for (H, HK, S, SK, D, groups) in ((4, 4, 1000, 1000, 64, 3), (4, 2, 300, 77, 64, 2), (40, 40, 2000, 2000, 128, 2)):
        q = torch.randn(1, S, H, D, device="cuda", generator=g).bfloat16().transpose(1, 2)
        k, v = (torch.randn(1, SK, HK, D, device="cuda", generator=g).bfloat16().transpose(1, 2) for _ in range(2))
        for schedule in (0, 3):
            a = hopper_attention(q, k, v, qk=qk, groups=groups, schedule=schedule)
            b = hopper_attention(q, k, v, qk=qk, groups=groups, schedule=schedule, persistent=True)
            torch.cuda.synchronize()
            print(qk, H, S, SK, D, groups, schedule, "same bits" if torch.equal(a, b) else f"DIFFERENT {(a.float() - b.float()).abs().max().item()}", flush=True)
    n_m, n = -(-1000 // 192), -(-1000 // 128)
    q = torch.randn(1, 1000, 4, 64, device="cuda", generator=g).bfloat16().transpose(1, 2)
    keep = torch.rand(1, 4, n_m, n, device="cuda", generator=g) < 0.5
    keep[0, 1, 2] = False
    cnt = keep.sum(-1).to(torch.int32)
    idx = torch.where(keep, torch.arange(n, device="cuda"), n).sort(-1).values.clamp_max(n - 1).to(torch.int32)
    a = hopper_attention(q, q, q, qk=qk, groups=3, kv_index=idx, kv_count=cnt)
    b = hopper_attention(q, q, q, qk=qk, groups=3, kv_index=idx, kv_count=cnt, persistent=True)
    torch.cuda.synchronize()
    print(qk, "lists", "same bits" if torch.equal(a, b) else "DIFFERENT", flush=True)
PY
    timeout 420 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 plain --list-lengths 16 65 216 \
        --variants default persistent=1 before --before benchmarks/experiments/hopper_attention_before.py 2>&1 \
        | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -50
    ;;
s10-prep)  # carry .big/a: keep the first half of the cutlass wheel; the Hopper tests of this session's options
    cp .big/a/cu13.partaa /tmp/
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 420 python3 -m pytest -q tests/test_hopper_kernel.py -k "tree or every_p_carry or refuses \
        or three_warpgroups or (matches_reference and schedule3) or (lists and schedule3)" 2>&1 | tail -4 \
        | tee "$OUT/pytest-hopper.txt"
    ;;
s10-final)  # carry .whl, after s10-prep and join: install; the list tests (fixed after s10-prep); every mode as ditgate
    # launches it against cuDNN and fa4 at both shapes, lists at densities 1/8, 1/4, 1/2 and 1 of LTX's 216 key blocks
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "lists_equal and schedule3" 2>&1 | tail -3 \
        | tee "$OUT/pytest-lists.txt"
    timeout 330 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 plain \
        --list-lengths 27 54 108 216 --variants default 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -30
    ;;
s11-bytes)  # carry .whl (no fa4): P's FP8 bytes from one FMA instead of an exp2 (byte_p): its GPU tests, then A/B
    # against the exp2 at both shapes and over FP8 lists at LTX (densities 1/8, 1/4, 1/2)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py -k "bytes" 2>&1 | grep -v "aux_data\|exe_args" \
        | tail -12 | tee "$OUT/pytest-bytes.txt"
    timeout 330 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 --list-lengths 27 54 108 \
        --variants byte_p=0 byte_p=1 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -30
    ;;
s11-final)  # carry .whl, after prep and join: install; every mode as ditgate launches it (byte_p on) against cuDNN
    # and fa4 at both shapes, lists at densities 1/8, 1/4, 1/2 and 1 of LTX's 216 key blocks; then the GPU tests
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 330 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 plain \
        --list-lengths 27 54 108 216 --variants default 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -30
    timeout 100 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -4 \
        | tee "$OUT/pytest-gpu.txt"
    timeout 120 python3 -m pytest -q tests/test_hopper_kernel.py -k "(lists_equal and schedule3) or tensor_core or tree" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest-hopper.txt"
    ;;
s12-pool)  # carry .whl, after prep and join: install; the sparse stage at both shapes (selected and window, FP8 and
    # plain on the Hopper schedule; the FP8 form with the selector pooling itself or its quantization pooling for it,
    # selection and kernel timed as one call), fa4 alongside; the fixed costs (quantization, selection, the kernel
    # alone over lists at schedules 0 and 3); the GPU tests of the shared copies and of the forms
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 300 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f ltx-2b-1216x704x257 \
        --patterns selected window --skip-attach --consumers ditgate_fp8_hopper ditgate_fp8_hopper_192 \
        fp8_sparse_form fp8_sparse_pooled ditgate_plain_hopper ditgate_plain_hopper_192 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -40
    timeout 150 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --schedules 0 3 2>&1 \
        | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -32
    timeout 120 python3 -m pytest -q tests/test_hopper_kernel.py -k "selectors_sums or (p_bytes_over_lists and d128)" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest-hopper.txt"
    timeout 100 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -4 \
        | tee "$OUT/pytest-gpu.txt"
    ;;
s12-final)  # carry .whl, after prep and join: install; FP8 lists at LTX with the producer's list loads ahead of its
    # stage waits against the kernel of 1d9413e ("before", written beside pin_ab.py by the caller); the fixed costs;
    # the sparse stage at both shapes with fa4 (the form pooling for its selection or not); GPU tests
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 120 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --shapes ltx --modes fp8 --list-lengths 65 216 \
        --variants default before --before benchmarks/experiments/hopper_attention_before.py 2>&1 \
        | tee "$OUT/pin-ab.log" | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -12
    timeout 100 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" 2>&1 | tee "$OUT/fixed-costs.log" \
        | grep -v "^{" | tail -20
    timeout 260 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f ltx-2b-1216x704x257 \
        --patterns selected window --skip-attach --consumers ditgate_fp8_hopper ditgate_fp8_hopper_192 \
        fp8_sparse_form fp8_sparse_pooled ditgate_plain_hopper ditgate_plain_hopper_192 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -44
    timeout 90 python3 -m pytest -q tests/test_hopper_kernel.py -k "selectors_sums or lists_equal" 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-hopper.txt"
    ;;
s13-lists)  # carry .whl (no fa4): each partition reads its list's count and first slots itself (_list_start):
    # the new list tests, then FP8 lists against HEAD-before's kernel (aafbab4, written beside pin_ab.py), the
    # kernel alone over lists with its line fit (fixed_costs.py)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "one_slot or (lists_equal and schedule3) or p_bytes_over" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-hopper.txt"
    timeout 200 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --shapes ltx wan --modes fp8 --rounds 2 \
        --list-lengths 27 54 108 --variants default before --before benchmarks/experiments/hopper_attention_before.py \
        2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -24
    timeout 120 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" 2>&1 | tee "$OUT/fixed-costs.log" \
        | grep -v "^{" | tail -20
    ;;
s13-quant)  # carry .whl (no fa4): quantize in three launches (Q beside K's sums and V's absmax; K's mean and V's scales;
    # K and V) where it took five and seven torch operations: the tests that read its copies, then the host's share
    # and GPU time against aafbab4's quantize (written beside host_costs.py), the passes alone, the fixed costs
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 270 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_fused_pooling.py tests/test_gpu.py \
        -k "not hopper_kernel or kept_descriptors or (matches_reference and schedule3 and not plain) or selectors_sums" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 200 python3 benchmarks/experiments/host_costs.py --out "$OUT" --variants memo --rounds 1 \
        --before-quant benchmarks/experiments/quant_attention_before.py 2>&1 | tee "$OUT/host-costs.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -16
    timeout 100 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" 2>&1 | grep -v "^{" | tail -14
    timeout 100 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" 2>&1 | tee "$OUT/fixed-costs.log" \
        | grep -v "^{" | tail -26
    ;;
s13-final)  # carry .whl (no fa4): K and V quantized in two launches at head dim 128 (four and eight warps), one at 64;
    # the tests that read the copies, then host_costs.py (descriptors kept or remade; quantize against aafbab4's)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_fused_pooling.py tests/test_gpu.py \
        -k "not hopper_kernel or kept_descriptors or (matches_reference and schedule3 and not plain and not even)" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 100 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" 2>&1 | grep -v "^{" | tail -20
    timeout 250 python3 benchmarks/experiments/host_costs.py --out "$OUT" --rounds 2 \
        --before-quant benchmarks/experiments/quant_attention_before.py 2>&1 | tee "$OUT/host-costs.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -32
    ;;
s13-parts)  # carry .whl (no fa4): at head dim 128 K and V each launch a kernel compiled for its part alone (PART 1, 2)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_fused_pooling.py \
        -k "not hopper_kernel or (matches_reference and schedule3 and not plain and not even) or selectors_sums" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest.txt"
    timeout 100 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" 2>&1 | grep -v "^{" | tail -20
    timeout 200 python3 benchmarks/experiments/host_costs.py --out "$OUT" --rounds 1 --variants memo \
        --before-quant benchmarks/experiments/quant_attention_before.py 2>&1 | tee "$OUT/host-costs.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -20
    ;;
s13-ltx)  # carry .whl, after prep and join: the sparse stage at LTX after this session's host work, fa4 alongside
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    sparse_ltx 40
    ;;
s13-scales)  # carry .whl (no fa4): _kv_scales_kernel reads every block in one step (up to 256) over 32 channels per
    # program; against e5f3a86's quantize (written beside host_costs.py, untracked)
    install_small
    timeout 60 python3 -m pytest -q tests/test_hopper_kernel.py tests/test_fused_pooling.py \
        -k "not hopper_kernel or (matches_reference and schedule3 and odd and not plain)" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -2 | tee "$OUT/pytest.txt"
    timeout 45 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" 2>&1 | grep "mean and V\|quantize_for" \
        | tee "$OUT/quantize-kernels.txt"
    timeout 130 python3 benchmarks/experiments/host_costs.py --out "$OUT" --shapes ltx wan --rounds 1 --variants memo \
        --calls 20 --before-quant benchmarks/experiments/quant_attention_before.py 2>&1 | grep "quantize" \
        | tee "$OUT/host-costs.txt"
    ;;
s13-host)  # carry .whl (no fa4): the workspace keeps the launch's descriptors and tile of ones (WorkspacePool.memo);
    # its test, then the host's share of the FP8 calls with them kept or remade, then the forms' GPU tests
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 100 python3 -m pytest -q tests/test_hopper_kernel.py -k "kept_descriptors" 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-kept.txt"
    timeout 240 python3 benchmarks/experiments/host_costs.py --out "$OUT" 2>&1 | tee "$OUT/host-costs.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -30
    timeout 150 python3 -m pytest -q tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -3 \
        | tee "$OUT/pytest-gpu.txt"
    ;;
s12-quant)  # carry .whl (no fa4): the quantization passes one at a time at 4 and 8 warps per program; then the Hopper
    # list tests at schedule 3 (the producer's list loads moved) and the forms' GPU tests
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 120 python3 benchmarks/experiments/quantize_kernels.py --out "$OUT" 2>&1 | tee "$OUT/quantize-kernels.log" \
        | grep -v "^{" | tail -24
    timeout 150 python3 -m pytest -q tests/test_hopper_kernel.py -k "selectors_sums or (lists_equal and schedule3)" \
        2>&1 | grep -v "aux_data\|exe_args" | tail -3 | tee "$OUT/pytest-hopper.txt"
    timeout 150 python3 -m pytest -q -rs tests/test_gpu.py tests/test_fused_pooling.py 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest-gpu.txt"
    ;;
s12-table)  # carry .whl, after prep and join: install; FP8 and INT8 as ditgate launches them against cuDNN and fa4 at
    # both shapes, FP8 lists at LTX; the sparse stage at both shapes (selected and window), fa4 alongside
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 150 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 --rounds 1 \
        --list-lengths 27 54 108 216 --variants default 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args" | tail -16
    timeout 220 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f ltx-2b-1216x704x257 \
        --patterns selected window --skip-attach --consumers ditgate_fp8_hopper ditgate_fp8_hopper_192 \
        fp8_sparse_form fp8_sparse_pooled ditgate_plain_hopper ditgate_plain_hopper_192 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32\|Warn" | tail -44
    ;;
s12-whole)  # carry .whl (no fa4): the FP8 sparse form's whole call at budget 0.3 at both shapes, the selector pooling
    # Q and K itself or the form's quantization pass pooling them, four interleaved rounds of do_bench medians
    install_small
    timeout 200 python3 benchmarks/experiments/fixed_costs.py --out "$OUT" --whole-rounds 4 --whole-only 2>&1 \
        | tee "$OUT/fixed-costs.log" | grep -v "^{" | tail -20
    ;;
s11-sparse)  # no carry, the machine warm after s11-final (its /tmp/site): the sparse stage at $MODELS (default LTX)
    timeout 560 python3 benchmarks/sparse_attention.py --out "$OUT" --models ${MODELS:-ltx-2b-1216x704x257} 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -40
    ;;
s11-wan-lists)  # carry .whl (no fa4): the sparse stage at Wan-14B, where FP8 over 128-row lists at head dim 128 now
    # makes P's bytes without exp2 (byte_p) on the Hopper schedule, against the Triton schedule's lists in the same run;
    # then the forms' GPU tests and the Hopper list tests that s11-final's timeouts cut short
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 250 python3 benchmarks/sparse_attention.py --out "$OUT" --models wan-14b-480p-81f 2>&1 \
        | tee "$OUT/sparse-attention.log" | grep -v "^{" | grep -E "dense|selected" | grep -v Warn | tail -30
    timeout 180 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -4 \
        | tee "$OUT/pytest-gpu.txt"
    timeout 120 python3 -m pytest -q tests/test_hopper_kernel.py -k "lists_equal and schedule3" 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest-hopper.txt"
    ;;
s10-tree)  # carry .whl (no fa4): each row's max as a tree of pairwise maxima or the compiler's chain (A/B), every
    # mode at both shapes and over lists; the outputs compared bit for bit
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 540 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 plain --list-lengths 16 65 \
        --variants tree_max=0 tree_max=1 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -40
    ;;
s10-probe)  # carry .whl (no fa4): INT8's P carried as packed FP8 bytes (narrow 2) or float16 (1) at LTX, A/B;
    # Nsight Compute's stall samples per SASS instruction for FP8 at LTX, dense and over lists (tc_sum off and on)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --shapes ltx --modes int8 --list-lengths \
        --variants narrow=1 narrow=2 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -12
    for run in "dense" "lists65 --lists 65 --tc-sum 0" "lists65tc --lists 65 --tc-sum 1"; do
        set -- $run
        name=$1; shift
        timeout 150 ncu --clock-control none -k regex:_hopper_attn_kernel -c 1 --section WarpStateStats \
            --section SourceCounters --section ComputeWorkloadAnalysis --section SpeedOfLight -f -o "/tmp/ncu-$name" \
            python3 benchmarks/ncu_target.py fp8 ltx "$@" > "$OUT/ncu-$name.log" 2>&1 || tail -5 "$OUT/ncu-$name.log"
        ncu -i "/tmp/ncu-$name.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$name.csv" 2> "$OUT/sass-$name.err"
        ncu -i "/tmp/ncu-$name.ncu-rep" --page details > "$OUT/ncu-$name.txt" 2>&1
        grep -i "duration\|issue slots busy\|eligible warps\|tensor\|cycles per issued" "$OUT/ncu-$name.txt" | head -8
        wc -c "$OUT/sass-$name.csv"; head -c 300 "$OUT/sass-$name.err"
    done
    ;;
s9-check)  # carry .whl (no fa4): the Hopper tests and the forms' GPU tests at the final commit; FP8 lists with the
    # tensor-core row sums or not (A/B)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 420 python3 -m pytest -q tests/test_hopper_kernel.py -k "tensor_core or refuses or (matches and schedule3) \
        or three_warpgroups or (lists and schedule3)" 2>&1 | tail -4 | tee "$OUT/pytest-hopper.txt"
    timeout 150 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -6 | tee "$OUT/pytest-gpu.txt"
    timeout 150 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --shapes ltx --modes fp8 --rounds 1 \
        --list-lengths 16 65 108 216 --variants tc_sum=0 tc_sum=1 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -16
    ;;
s9-final)  # carry .whl after prep and join: install; FP8 and INT8 as ditgate launches them against cuDNN and fa4
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 300 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --modes fp8 int8 --list-lengths \
        --variants default ${PIN_ARGS:-} 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | grep -v "aux_data\|exe_args" | tail -30
    ;;
s9-tcsum)  # carry .whl (no fa4): P's row sums from the tensor cores (P times ones) against the softmax's adds
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 240 python3 -m pytest -q -x tests/test_hopper_kernel.py -k "tensor_core_row_sums or refuses" \
        2>&1 | tail -4 | tee "$OUT/pytest-hopper.txt"
    timeout 330 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --list-lengths 16 65 216 \
        --variants tc_sum=0 tc_sum=1 ${PIN_ARGS:-} 2>&1 | tee "$OUT/pin-ab.log" | grep -v "^{" | tail -60
    ;;
s9-keys)  # carry .whl (no fa4), at commit 4dcb3b0 (the keys option was removed after it lost): 256 key rows per stage
    # against 128 (dense quantized calls), tests then A/B
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q -x tests/test_hopper_kernel.py -k "256_key or refuses or (matches and schedule3 and fp8)" \
        2>&1 | tail -4 | tee "$OUT/pytest-hopper.txt"
    timeout 360 python3 benchmarks/experiments/pin_ab.py --out "$OUT" --list-lengths --modes fp8 int8 \
        --schedules 3 0 --variants keys=128 keys=256,groups=2 ${PIN_ARGS:-} 2>&1 | tee "$OUT/pin-ab.log" \
        | grep -v "^{" | tail -60
    ;;
s8-pin)  # carry .whl (no fa4): the pinned softmax against the unpinned, dense and over lists; the Hopper tests with it
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q -x tests/test_hopper_kernel.py \
        -k "three_warpgroups or (lists and schedule3) or (matches and (schedule1 or schedule3 or schedule4))" 2>&1 \
        | tail -4 | tee "$OUT/pytest-hopper.txt"
    timeout 330 python3 benchmarks/experiments/pin_ab.py --out "$OUT" ${PIN_ARGS:-} 2>&1 | tee "$OUT/pin-ab.log" \
        | grep -v "^{" | tail -60
    ;;
s7-prep)  # carry .big/a: keep the first half; the Hopper schedule over lists of 128 and 192 query rows (no diffusers)
    cp .big/a/cu13.partaa /tmp/
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 300 python3 -m pytest -q tests/test_hopper_kernel.py -k "lists or refuses or compiles" 2>&1 | tail -4 \
        | tee "$OUT/pytest-hopper.txt"
    ;;
s7-check)  # carry .whl (no fa4): the forms' GPU tests (192-row lists included), then where the selector's time goes
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 200 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -6 | tee "$OUT/pytest-gpu.txt"
    timeout 200 python3 benchmarks/selector_breakdown.py --out "$OUT" 2>&1 | grep -v "^{" | tail -40
    ;;
join)  # carry .big/b after a stage that left the first half in /tmp
    cat /tmp/cu13.partaa .big/b/cu13.partab > "$CU13" && ls -la "$CU13"
    ;;
s7-final)  # carry .whl after a stage that left the first half in /tmp and `join`: install; GPU tests of the forms; the
    # sparse stage at $MODELS (both shapes by default; call b of results s7 ran this at LTX, inline)
    install
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 200 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -6 | tee "$OUT/pytest-gpu.txt"
    timeout 360 python3 benchmarks/sparse_attention.py --out "$OUT" ${MODELS:+--models $MODELS} 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32" | grep -v "radial\|window" | tail -40
    ;;
s6-groups)  # carry .whl (no fa4): three consumer warpgroups (192 query rows) against two; their tests
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    HEAD_DIM=64 GROUPS="2 3" smoke 3 || exit 4
    timeout 110 python3 -m pytest -q tests/test_hopper_kernel.py -k "three_warpgroups or refuses" 2>&1 | tail -4 \
        | tee "$OUT/pytest-hopper.txt"
    timeout 240 python3 benchmarks/hopper_kernel.py --out "$OUT" --shapes ltx-1216x704x257 --schedules 3 4 \
        --groups 2 3 --no-triton 2>&1 | tee "$OUT/hopper-kernel.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" \
        | tail -32
    ;;
s6-final)  # carry .whl .big/b after prep: join, install; every GPU test of the forms; the kernels against cuDNN and fa4
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 220 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -6 | tee "$OUT/pytest-gpu.txt"
    timeout 300 python3 benchmarks/hopper_kernel.py --out "$OUT" --schedules 3 2>&1 | tee "$OUT/hopper-kernel.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -30
    ;;
s5-kernel)
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    smoke || exit 4
    timeout 120 python3 -m pytest -q -x tests/test_hopper_kernel.py -k "not compiles and not moving" 2>&1 | tail -6 | tee "$OUT/pytest-hopper.txt"
    timeout 340 python3 benchmarks/hopper_kernel.py --out "$OUT" --schedules 0 1 2 2>&1 | tee "$OUT/hopper-kernel.log" \
        | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -45
    ;;
s5-sparse)
    [ -d "$SITE/flash_attn" ] || { echo "no $SITE: run s5-kernel first, on the same warm machine"; exit 3; }
    timeout 200 python3 -m pytest -q -rs tests/test_gpu.py 2>&1 | grep -v "aux_data\|exe_args" | tail -4 | tee "$OUT/pytest-gpu.txt"
    timeout 380 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32" | tail -75
    ;;
s5-ab)  # carry .whl (no fa4): the overlapped schedules with the output rescaled late (1, 2) or early (3, 4); the Hopper tests
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 240 python3 benchmarks/hopper_kernel.py --out "$OUT" --modes plain fp8 --schedules 1 2 3 4 --no-triton 2>&1 \
        | tee "$OUT/hopper-kernel.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -30
    timeout 200 python3 -m pytest -q tests/test_hopper_kernel.py -k "not compiles and not moving" 2>&1 | tail -4 \
        | tee "$OUT/pytest-hopper.txt"
    ;;
s5-ncu)  # no carry, warm: Nsight Compute on one launch of the Hopper schedule (clocks left alone)
    for run in "fp8 wan" "plain ltx"; do
        set -- $run
        timeout 100 ncu --clock-control none -k regex:_hopper_attn_kernel -c 1 --section SpeedOfLight \
            --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats \
            --section SchedulerStats python3 benchmarks/ncu_target.py $1 $2 > "$OUT/ncu-$1-$2.txt" 2>&1
        grep -i "duration\|throughput\|issue slots\|stall\|pipe\|executed ipc\|eligible\|active warps" "$OUT/ncu-$1-$2.txt" | head -30
    done
    ;;
hopper-first)
    install_small
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    smoke || exit 4
    timeout 200 python3 -m pytest -q -x tests/test_hopper_kernel.py -k "not compiles" 2>&1 | tail -25 | tee "$OUT/pytest-hopper.txt"
    timeout 330 python3 benchmarks/hopper_kernel.py --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/hopper-kernel.log" \
        | grep -v "^{" | tail -40
    ;;
final-s4)  # carry .whl .big/b after prep: GPU tests (the Hopper schedule's included), selector parts, sparse stage
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 170 python3 -m pytest -q -rs tests/test_gpu.py tests/test_hopper_kernel.py -k "not compiles" 2>&1 \
        | grep -v "aux_data\|exe_args" | tail -8 | tee "$OUT/pytest-gpu.txt"
    timeout 60 python3 benchmarks/selector_breakdown.py --out "$OUT" 2>&1 | grep -v "^{" | tail -26
    timeout 320 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32" | tail -12
    ;;
hopper)  # carry .whl .big/b after prep: join, install; the Hopper schedule against fa4; the sparse stage
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 100 python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -4 | tee "$OUT/pytest-gpu.txt"
    timeout 120 python3 benchmarks/hopper_kernel.py --out "$OUT" --modes plain fp8 --schedules 0 1 --no-triton \
        2>&1 | tee "$OUT/hopper-kernel.log" | grep -v "^{" | grep -v "aux_data\|exe_args\|float32" | tail -24
    timeout 420 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32" | tail -30
    ;;
prep)
    cp .big/a/cu13.partaa /tmp/ && ls -la /tmp/cu13.partaa
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    ;;
prep-quant)  # carry .big/a: keep the first half; GPU kernel tests; the quant kernel against cuDNN (no fa4 yet)
    cp .big/a/cu13.partaa /tmp/
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 100 python3 -m pytest -q -x tests/test_quant_kernel.py -k "not route" 2>&1 | tail -3 | tee "$OUT/pytest-quant-gpu.txt"
    timeout 480 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --out "$OUT" \
        --best-out /tmp/quant-best.json 2>&1 | tee "$OUT/quant-kernel.log" | grep -v "^{"
    ;;
prep-sparse)  # carry .big/a: keep the first half; the sparse stage on captured activations (cuDNN as exact)
    cp .big/a/cu13.partaa /tmp/
    timeout 500 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{"
    ;;
final)  # carry .whl .big/b: join, install; GPU tests; the quant kernel and the sparse stage with fa4 alongside
    install
    nvidia-smi --query-gpu=name,driver_version --format=csv
    timeout 150 python3 -m pytest -q tests/test_gpu.py tests/test_quant_kernel.py 2>&1 | tail -3 | tee "$OUT/pytest-gpu.txt"
    timeout 200 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --configs 0 1 3 5 \
        --out "$OUT" 2>&1 | tee "$OUT/quant-kernel.log" | grep -v "^{" | tail -34
    timeout 330 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{"
    ;;
final-sparse)  # carry .whl .big/b: join, install; the sparse stage only (fa4's block-sparse path included)
    install
    timeout 400 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{"
    ;;
kernels)  # carry .whl .big/b: join, install; GPU tests; plain / fp8 / int8 at pointer, TMA and warp-specialized tiles
    install
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    python3 -c "import torch, triton, diffusers; print('torch', torch.__version__, 'triton', triton.__version__, 'diffusers', diffusers.__version__)"
    timeout 170 python3 -m pytest -q tests/test_gpu.py tests/test_quant_kernel.py 2>&1 | tail -12 | tee "$OUT/pytest-gpu.txt"
    timeout 390 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --modes fp8 int8 plain \
        --configs 0 1 4 5 13 14 15 16 17 18 --out "$OUT" 2>&1 | tee "$OUT/quant-kernel.log" | grep -v "^{" | tail -70
    ;;
sparse)  # carry .whl .big/b after prep: join, install; the sparse stage with fa4's block-sparse path
    install
    python3 -c "from flash_attn.cute import flash_attn_func; print('fa4 imports')" 2>&1 | tail -1
    timeout 60 python3 benchmarks/selector_breakdown.py --out "$OUT" 2>&1 | grep -v "^{"
    timeout 480 python3 benchmarks/sparse_attention.py --out "$OUT" 2>&1 | tee "$OUT/sparse-attention.log" | grep -v "^{" \
        | grep -v "aux_data\|exe_args\|float32"
    ;;
crossover)  # no carry, after `kernels` or `sparse`: where the gate starts choosing sparse forms, Wan-14B and LTX widths
    [ -d "$SITE/flash_attn" ] || { echo "no $SITE: run kernels first, on the same warm machine"; exit 3; }
    timeout 300 python3 benchmarks/sparse_crossover.py --out "$OUT" --model wan-14b-480p-81f --frames 1 2 3 5 9 13 21 \
        2>&1 | tee "$OUT/sparse-crossover-wan.log" | grep -v "float32"
    timeout 240 python3 benchmarks/sparse_crossover.py --out "$OUT" --model ltx-2b-1216x704x257 --frames 1 2 4 8 16 33 \
        2>&1 | tee "$OUT/sparse-crossover-ltx.log" | grep -v "float32"
    ;;
main)
    install
    python3 -c "import torch, diffusers, triton; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
    python3 -m ditgate.cli.main doctor 2>&1 | tee "$OUT/doctor.txt"
    timeout 120 python3 -m pytest -q tests/test_gpu.py 2>&1 | tail -5 | tee "$OUT/pytest-gpu.txt"
    timeout 330 python3 benchmarks/wan_attach.py --out "$OUT" --rounds 5 2>&1 | tee "$OUT/wan-attach.log" | grep -v "^ditgate gate" | tail -40
    timeout 150 python3 -m ditgate.cli.main bench kernels --preset flux-1024 ltx-768x512x121 ltx-1216x704x257 \
        wan-1.3b-480p wan-14b-480p --warm 15 --out "$OUT" 2>&1 | tail -60
    ;;
quant)
    install
    timeout 150 python3 -m pytest -q tests/test_gpu.py tests/test_quant_kernel.py 2>&1 | tail -5 | tee "$OUT/pytest-gpu.txt"
    timeout 400 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --out "$OUT" \
        --configs-from /tmp/quant-best.json 2>&1 | tee "$OUT/quant-kernel.log" | grep -v "^{"
    ;;
check-tall)  # carry .whl .big/b after prep: join, install; GPU tests (sparse consumers, fa4's included); then `tall`
    install
    timeout 170 python3 -m pytest -q -rs tests/test_gpu.py tests/test_quant_kernel.py 2>&1 | tail -12 | tee "$OUT/pytest-gpu.txt"
    bash "$0" tall
    ;;
selector)  # no carry: where the tile selector's time goes at the Wan-14B and LTX shapes
    timeout 200 python3 benchmarks/selector_breakdown.py --out "$OUT" 2>&1 | grep -v "^{"
    ;;
tall)  # no carry: fp8 and plain at taller query tiles (256 and 192 rows) against the 128-row defaults
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 400 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --modes fp8 plain \
        --configs 1 4 19 20 21 22 23 24 --out "$OUT" 2>&1 | tee "$OUT/quant-kernel.log" | grep -v "^{" | tail -40
    ;;
quant-short)  # no carry: the quant kernel against cuDNN at the two target shapes, five configurations
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
    timeout 330 python3 benchmarks/quant_kernel.py --shapes wan-14b-480p ltx-1216x704x257 --configs 0 1 2 4 5 \
        --out "$OUT" 2>&1 | tee "$OUT/quant-kernel.log" | tail -45
    timeout 120 python3 -m pytest -q -x tests/test_quant_kernel.py 2>&1 | tail -3 | tee "$OUT/pytest-quant-gpu.txt"
    ;;
models)
    timeout 330 python3 -m ditgate.cli.main bench model --preset wan-1.3b-480p-81f --rounds 3 --out "$OUT" 2>&1 | tail -30
    timeout 200 python3 -m ditgate.cli.main bench model --preset ltx-2b-768x512x121 --rounds 5 --out "$OUT" 2>&1 | tail -30
    ;;
esac
