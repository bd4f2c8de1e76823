#!/usr/bin/env bash
# rlrig and every package it needs that the GPU machine lacks, as one file of at most 60 MiB that
# bench/gpu_check.sh unpacks there before it starts: .gpu/site.tar.xz. Built on any x86_64 Linux machine with the
# package index at hand, for the GPU machine's Python (RLRIG_GPU_PYTHON, default 3.12) and nothing else: the GPU
# machine needs no network. What it already has is bench/gpu_machine_packages.txt (the distribution names of its
# `pip list`): those are not carried, except typing-extensions. Ray's Java jars and RLlib, which rlrig never loads,
# are left out to fit.
#
#     bash bench/gpu_bundle.sh      # then carry .gpu and run: bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
target=${RLRIG_GPU_PYTHON:-3.12}
limit=$((60 * 2 ** 20))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/wheels" .gpu

# every distribution rlrig and its liger extra resolve to, as pip resolves them here, less the machine's own
"$py" -m pip install -q --dry-run --ignore-installed --report "$work/report.json" ".[liger]" >/dev/null
"$py" - "$work/report.json" bench/gpu_machine_packages.txt >"$work/need.txt" <<'EOF'
import json, re, sys

norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {norm(line.split("#")[0].strip()) for line in open(sys.argv[2]) if line.split("#")[0].strip()}
for item in json.load(open(sys.argv[1]))["install"]:
    meta = item["metadata"]
    # pydantic needs a newer typing-extensions than an older machine may hold; carried, it comes first on the path
    if norm(meta["name"]) not in (have - {"typing-extensions"}) | {"rlrig"}:
        print(f"{meta['name']}=={meta['version']}")
EOF
echo "carried besides rlrig: $(tr '\n' ' ' <"$work/need.txt")"

abi="cp${target/./}"
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64
    --platform linux_x86_64 --platform any)
while read -r req; do
    # a package published only as a source archive (antlr4-python3-runtime: pure Python) is built into a wheel here
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$target" --implementation cp \
        --abi "$abi" --abi abi3 --abi none "${platforms[@]}" -d "$work/wheels" "$req" 2>/dev/null \
        || "$py" -m pip wheel -q --no-deps -w "$work/wheels" "$req"
done <"$work/need.txt"
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheels" .
"$py" -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version "$target" --implementation cp \
    --abi "$abi" --abi abi3 --abi none "${platforms[@]}" --target "$work/site" "$work"/wheels/*.whl
rm -rf "$work/site/ray/jars" "$work/site/ray/rllib"
# the scripts name this machine's interpreter: gpu_check.sh writes the GPU machine's in its place
for f in "$work"/site/bin/*; do
    if head -c2 "$f" | grep -q '#!'; then sed -i '1s|^#!.*python.*$|#!RLRIG_GPU_PYTHON|' "$f"; fi
done
tar -C "$work/site" -cf - . | xz -T0 -7 >.gpu/site.tar.xz.part
size=$(stat -c %s .gpu/site.tar.xz.part)
if ((size > limit)); then
    rm -f .gpu/site.tar.xz.part
    echo "gpu_bundle: ${size} bytes, over the ${limit} the GPU machine takes in one call; leave out more" >&2
    exit 1
fi
mv .gpu/site.tar.xz.part .gpu/site.tar.xz
echo "gpu_bundle: .gpu/site.tar.xz, $((size / 2 ** 20)) MiB"
