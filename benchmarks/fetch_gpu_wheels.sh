#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels the lent GPU machine (Python 3.12, no network) lacks.
#   .whl/        diffusers, flash-attn-4 and its needs, sageattention (16 MB)
#   .whl2/       fa3-fwd (27.6 MB)
#   .big/a .big/b .big/c  the 92 MB cutlass cu13 library wheel in three parts (gpu.sh says which call carries which)
# The folders are ignored (.git/info/exclude) and named in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
grep -qx '/.whl2/' .git/info/exclude 2>/dev/null || echo '/.whl2/' >> .git/info/exclude
grep -qx '/.big/' .git/info/exclude 2>/dev/null || echo '/.big/' >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 any; do platforms+=(--platform "$p"); done
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$1" "${@:2}"; }
mkdir -p .whl .whl2 .big/a .big/b .big/c /tmp/ditgate-big
get .whl diffusers==0.42.1 importlib_metadata==8.7.0 sageattention==1.0.6 \
    flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
get /tmp/ditgate-big nvidia-cutlass-dsl-libs-cu13==4.8.1
(cd /tmp/ditgate-big && split -b 31M nvidia_cutlass_dsl_libs_cu13-4.8.1-*.whl cu13.part)
mv /tmp/ditgate-big/cu13.partaa .big/a/ && mv /tmp/ditgate-big/cu13.partab .big/b/ && mv /tmp/ditgate-big/cu13.partac .big/c/
# fa3-fwd's wheel is tagged manylinux_2_24 (cp39-abi3)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 -d .whl2 fa3-fwd==0.0.3
du -sh .whl .whl2 .big/a .big/b .big/c
