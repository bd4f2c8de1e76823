#!/usr/bin/env bash
# The whole GPU check, within 7 minutes on one GPU: bench/gpu_step.py at the 0.5B shape (FSDP2 and DDP, eager, the
# update's profile; then verl's kernel switches on), at the 7B shape (8 of its 28 layers, gradient checkpointing),
# and tests/gpu. Every run takes random responses of the full length (--no-gen: the update's cost is in its tokens)
# and verl's token-budget micro batches. Each part has a limit of its own, so a slow or failing part leaves the
# others their time. Logs and JSON go to $OUT (else ./gpu-out).
#
#     bash bench/gpu_check.sh
set -uo pipefail
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
common=(--precisions bf16 --no-gen --token-budget 32768)
eager=(--override actor_rollout_ref.actor.use_torch_compile=False)
kernels=(--override actor_rollout_ref.model.use_fused_kernels=True --override actor_rollout_ref.model.use_liger=True)
rc=0
part() {  # part NAME SECONDS COMMAND...: its output to $out/NAME.log, its failure counted
    local name=$1 limit=$2
    shift 2
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | grep -v "Loading weights\|Writing model" | tee "$out/$name.log" || rc=1
}
part step_0.5b 90 "$py" bench/gpu_step.py "${common[@]}" "${eager[@]}" --strategies fsdp,ddp --profile \
    --json "$out/step_0.5b.json"
part step_0.5b_kernels 100 "$py" bench/gpu_step.py "${common[@]}" "${kernels[@]}" --strategies fsdp \
    --json "$out/step_0.5b_kernels.json"
part step_7b 100 "$py" bench/gpu_step.py --shape 7b --prompts 16 "${common[@]}" "${eager[@]}" \
    --override actor_rollout_ref.model.use_fused_kernels=True --strategies fsdp --profile --json "$out/step_7b.json"
part tests_gpu 90 "$py" -m pytest -q -p no:cacheprovider tests/gpu --durations 8
exit $rc
