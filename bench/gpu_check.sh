#!/usr/bin/env bash
# The whole GPU check, within 9 minutes on one GPU (RLRIG_GPU_CHECK_S, default 520 s, for all of it):
# bench/gpu_step.py at the 0.5B shape, eager under FSDP2 (with the update's profile) and DDP; the same with verl's
# kernel switches on (fused head, Liger, compiled log-prob math and blocks); the 7B shape (8 of its 28 layers,
# gradient checkpointing, fused head) with its profile; Qwen3-30B-A3B's mixture of experts (4 of its 48 layers)
# against the dense model of the same active parameters; then tests/gpu, the cases of these switches first. Every
# run takes random responses of the full length (--no-gen: the update's cost is in its tokens) and verl's token-budget
# micro batches. Each part has a limit of its own and tests/gpu the time left, so a slow or failing part leaves the
# others theirs. Logs and JSON go to $OUT/gpu-check.tgz (else ./gpu-out/). On a machine without rlrig installed,
# bench/gpu_bundle.sh's .gpu/site.tar.xz (carried beside the checkout) is unpacked first.
#
#     bash bench/gpu_bundle.sh    # where the package index is
#     bash bench/gpu_check.sh     # on the GPU machine
set -uo pipefail
py=${PYTHON:-python3}
deadline=$((SECONDS + ${RLRIG_GPU_CHECK_S:-520}))
export PYTHONUNBUFFERED=1
# rlrig and what the machine lacks, from bench/gpu_bundle.sh, where they were carried in
if [ -f .gpu/site.tar.xz ]; then
    site=${RLRIG_GPU_SITE:-/tmp/rlrig-site}
    rm -rf "$site" && mkdir -p "$site" && tar -C "$site" -xJf .gpu/site.tar.xz
    grep -l '^#!RLRIG_GPU_PYTHON$' "$site"/bin/* | xargs -r sed -i "1s|^#!RLRIG_GPU_PYTHON\$|#!$(command -v "$py")|"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
fi
if ! "$py" -c "import rlrig.trainer.workers.training_worker, ray" 2>&1; then
    echo "gpu_check: rlrig does not import here (above); on a CUDA torch machine without it, carry the .gpu folder that bash bench/gpu_bundle.sh builds" >&2
    exit 2
fi
# what comes back: each part's log and JSON, packed into one file at the end (a device call returns few files)
final=${OUT:-gpu-out}
out=$(mktemp -d)
trap 'tar -C "$out" -czf "$final/gpu-check.tgz" . && echo "gpu_check: logs and JSON in $final/gpu-check.tgz"' EXIT
mkdir -p "$final"
common=(--precisions bf16 --no-gen --token-budget 32768)
eager=()
for k in actor.use_torch_compile actor.fsdp_config.use_torch_compile ref.fsdp_config.use_torch_compile; do
    eager+=(--override "actor_rollout_ref.$k=False")
done
fused=(--override actor_rollout_ref.model.use_fused_kernels=True)
rc=0
part() {  # part NAME SECONDS COMMAND...: at most SECONDS (and never past the deadline), output in $out/NAME.log
    local name=$1 limit=$2 left=$((deadline - SECONDS))
    shift 2
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        echo "=== $name: skipped, ${left}s left"
        rc=1
        return
    fi
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v "Loading weights\|Writing model" | tee "$out/$name.log" || rc=1
}
part step_0.5b 130 "$py" bench/gpu_step.py "${common[@]}" "${eager[@]}" --strategies fsdp,ddp --profile \
    --json "$out/step_0.5b.json"
part step_0.5b_kernels 90 "$py" bench/gpu_step.py "${common[@]}" "${fused[@]}" \
    --override actor_rollout_ref.model.use_liger=True --strategies fsdp --json "$out/step_0.5b_kernels.json"
part step_7b 100 "$py" bench/gpu_step.py --shape 7b --prompts 16 "${common[@]}" "${eager[@]}" "${fused[@]}" \
    --strategies fsdp --profile --json "$out/step_7b.json"
part step_moe 100 "$py" bench/gpu_step.py --shape 30b-a3b,30b-a3b-dense --prompts 16 "${common[@]}" "${eager[@]}" \
    "${fused[@]}" --strategies fsdp --json "$out/step_moe.json"
new="compiled_log_prob or liger_steps or gradient_checkpointing_recomputes or fsdp_packed or bf16_mixed"
part tests_gpu_kernels 80 "$py" -m pytest -q -p no:cacheprovider tests/gpu -k "$new" --durations 5
part tests_gpu_rest 400 "$py" -m pytest -q -p no:cacheprovider tests/gpu -k "not ($new)" --durations 5
exit $rc
