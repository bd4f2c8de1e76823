#!/usr/bin/env bash
# The GPU check, in two halves of at most 9 minutes each on one GPU (RLRIG_GPU_CHECK_S, default 520 s, for a half):
#
#   steps: bench/gpu_step.py at the 0.5B shape with verl's kernel switches on (fused head, Liger, compiled log-prob
#          math), then with the fused head and compiled blocks, each with the update's profile; eager under FSDP2 and
#          DDP (FSDP2's time over DDP's); the 7B shape (8 of its 28 layers, gradient checkpointing, fused head) with
#          its profile; Qwen3-30B-A3B's mixture of experts (4 of its 48 layers) against the dense model of the same
#          active parameters. Every run takes random responses of the full length (--no-gen: the update's cost is in
#          its tokens) and verl's token-budget micro batches.
#   tests: tests/gpu, each case at most 120 s, the embedded default's 200 learning steps last.
#
# With no argument both run, in one call where its limit allows; arguments name halves or single parts (`bash
# bench/gpu_check.sh step_0.5b_compiled tests_gpu`), for a short time on a GPU. Where kernel launches are slow,
# tests/gpu alone takes minutes (the tiny model's many small kernels), so run the halves as two calls. Each part has a
# limit of its own, so a slow or failing part leaves the others theirs. Logs and JSON go to $OUT/gpu-check.tgz (else
# ./gpu-out/). On a machine without rlrig installed, bench/gpu_bundle.sh's .gpu/site.tar.xz (carried beside the
# checkout) is unpacked first.
#
#     bash bench/gpu_bundle.sh                              # where the package index is
#     bash bench/gpu_check.sh steps; bash bench/gpu_check.sh tests   # on the GPU machine
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
    local half=${name%%_*}
    [[ $half == step ]] && half=steps
    case " $chosen " in *" $name "* | *" $half "*) ;; *) return ;; esac
    if ((limit < 20)); then
        echo "=== $name: skipped, ${left}s left"
        rc=1
        return
    fi
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | grep --line-buffered -v "Loading weights\|Writing model" | tee "$out/$name.log" || rc=1
}
chosen=${*:-steps tests}
case " $chosen " in *" step"*)
    part step_0.5b_kernels 100 "$py" bench/gpu_step.py "${common[@]}" "${fused[@]}" \
        --override actor_rollout_ref.model.use_liger=True --strategies fsdp --profile --json "$out/step_0.5b_kernels.json"
    # inductor's own fusion of the blocks' norms, rotary and SwiGLU (Liger keeps the blocks uncompiled)
    part step_0.5b_compiled 100 "$py" bench/gpu_step.py "${common[@]}" "${fused[@]}" --strategies fsdp --profile \
        --json "$out/step_0.5b_compiled.json"
    part step_0.5b 120 "$py" bench/gpu_step.py "${common[@]}" "${eager[@]}" --strategies fsdp,ddp \
        --json "$out/step_0.5b.json"
    part step_7b 110 "$py" bench/gpu_step.py --shape 7b --prompts 16 "${common[@]}" "${eager[@]}" "${fused[@]}" \
        --strategies fsdp --profile --json "$out/step_7b.json"
    part step_moe 100 "$py" bench/gpu_step.py --shape 30b-a3b,30b-a3b-dense --prompts 16 "${common[@]}" \
        "${eager[@]}" "${fused[@]}" --strategies fsdp --json "$out/step_moe.json"
    ;;
esac
case " $chosen " in *" tests"*)
    # the learning run last: on slow kernel launches its 200 steps take minutes, and the other cases theirs first
    learn=test_embedded_default_learns_on_cuda
    tests=(-m pytest -q -p no:cacheprovider -rfEs --timeout 120 --durations 15)
    reserve=220
    case " $chosen " in *" tests "* | *" tests_gpu_learning "*) ;; *) reserve=0 ;; esac
    part tests_gpu $((deadline - SECONDS - reserve)) "$py" "${tests[@]}" tests/gpu -k "not $learn"
    part tests_gpu_learning 400 "$py" "${tests[@]}" --timeout 380 -s tests/gpu -k "$learn"
    ;;
esac
exit $rc
