#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (whose python3 holds a CUDA torch; no .venv needed):
#   1. exactness on CUDA: the gpu-marked greedy and sampling exactness tests (float32), and warm-up's linear touches;
#      then what those touches cost at start-up (every row count up to 2048, target and draft);
#   2. the policy sweep on the GPU (off, adaptive, draft k=4, n-gram k=4), cells in order of value, while time lasts:
#      first code T=0 at 32 clients, the one cell under target, with the A/B variants (plan every step, long matches,
#      no guard); then the bf16 flip rate; then the cell again. H200, 2026-11-28 (s41, plan reuse and every n-gram
#      match): 0.939x [0.922, 0.955] n-gram k=4 over 16 runs in 4 cells, 1.149x off; the virtual clock read
#      0.98-0.99x. The gap it misses: adaptive met row counts new to the process in every run (2.5% of its second
#      run, step_stalls), which warm-up now touches on GPUs (`touch_linears`, unmeasured there yet); and its own
#      work, ~4% of each run against n-gram k=4's ~1.3%. Each cell's log prints adaptive's cost model as measured /
#      predicted seconds per kind of step at its load and each policy's own work as a share of its runs, and its
#      JSON keeps the fit and guard figures per run;
#   3. what one target pass costs by its mix of decodes and verification, with decodes in an attention group of
#      their own or merged into the verifying requests' (bench/attention_groups.py; merged on GPUs since 2026-11-28);
#   4. what a shape new to the process costs (bench/first_touch.py: ~50 ms per masked-attention shape with cuDNN);
#   5. which steps stall on the GPU, and whether they ran a shape for the first time (bench/step_stalls.py), at 32
#      clients with every step traced: what adaptive's mixed steps cost against a fixed policy's uniform ones;
#   6. issue 2's roofline: decode of a random Llama-3.2-3B-shaped model in bf16, batch 1 and 16, vs transformers;
#   7. how often bf16 batch shapes flip greedy near-ties on the GPU (bench/bf16_divergence.py);
#   8. one more sweep cell, at 1 client (slow on a GPU).
# First run (H200, 2026-11-26): exactness, roofline and bf16 flips took 32 s, 69 s and 55 s; a sweep cell of 7
# policies x 3 runs ~110 s. H100, 2026-11-27, without cuDNN attention: exactness 42 s, first_touch 12 s,
# step_stalls 33 s, sweep cells of 4 policies 40-48 s at 8 clients, 61 s at 32, over 110 s at 1 client.
# H200, 2026-11-28: exactness 27-36 s, a cell of 4 policies x 6 runs at 32 clients 80 s, attention_groups 20 s.
# H200, 2026-11-28 (s41): a cell of 7 policies x 3 runs at 32 clients 60 s, of 5 x 5 runs 80 s, bf16 flips 29 s,
# step_stalls 24 s, roofline 61 s; the 1-client cell did not finish in the 116 s left of a 520 s budget.
# Each step has its own time limit and a failed step does not stop the others. Logs and results go to
# ${OUT:-bench/results/gpu}; results and logs are tarred there as results.tgz (the device tool returns few files).
# The device tool takes at most 64 MiB of tracked tree: result JSONs over 100 KB from before 2026-11-28, and the sweep
# rounds' since, are kept gzipped (the tree is ~59 MB; bench.sweep_pool reads .json.gz). Should it grow past the
# limit, gzip more of bench/results.
#
#   OUT=/tmp/gpu BUDGET_S=480 bash bench/gpu_checks.sh
set -u
OUT=${OUT:-bench/results/gpu}
BUDGET_S=${BUDGET_S:-480}
PY=${PY:-python3}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
start=$SECONDS
stamp=$(mktemp)  # results newer than this are this run's

step() {  # step NAME LIMIT_S COMMAND...: run, log, report rc; never abort the script
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s, at $((SECONDS - start))s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.log"
    echo "== $name: rc $rc after $((SECONDS - start))s"
}

left() { echo $((BUDGET_S - (SECONDS - start))); }

nvidia-smi -L
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
torch.cuda.get_device_name())"
step exactness 150 $PY -m pytest -q -p no:cacheprovider -m gpu -W ignore::pytest.PytestConfigWarning \
    tests/integration/test_exactness.py tests/integration/test_sampling_exactness.py tests/unit/test_llama_parity.py
# what warm-up's linear touches (`touch_linears`, every row count up to the sweep engines' 2048) cost at start-up
step touch_linears 90 $PY -c "
import time, torch
from engine.models.llama import touch_linears
from engine.models.loader import DEFAULT_DRAFT, DEFAULT_TARGET, load_model
for path in (DEFAULT_TARGET, DEFAULT_DRAFT):
    model, _ = load_model(path, torch.bfloat16, torch.device('cuda'))
    start = time.perf_counter()
    touch_linears(model, 2048)
    print(path.name, 'touched 2048 row counts in', round(time.perf_counter() - start, 2), 's')"
sweep_cell() {  # sweep_cell WORKLOAD TEMPERATURE CONCURRENCY [SUFFIX POLICIES]: one policy-sweep cell, if a minute is left
    [ "$(left)" -gt 60 ] || return
    local name=policy_sweep_cuda_${1}_c${3}_t${2//./_}${4:-}
    step "$name" "$(left)" $PY -m bench.policy_sweep --device cuda --dtype bfloat16 --repeats 3 \
        --policies "${5:-draft k=4,ngram k=4}" --workloads "$1" --temperatures "$2" --concurrency "$3" --output "$name"
}
# the target cell with the A/B variants: is plan reuse, are short n-gram matches, is the guard worth it on a GPU?
sweep_cell code 0 32 _variants "draft k=4,ngram k=4,adaptive (plan every step),adaptive (long matches),adaptive (no guard)"
[ "$(left)" -gt 90 ] && step bf16_divergence 90 $PY -m bench.bf16_divergence --device cuda
sweep_cell code 0 32  # the target cell again: a second measurement of the same code
sweep_cell code 0 8
sweep_cell code 1.0 8
sweep_cell prose 0.7 8
[ "$(left)" -gt 45 ] && step attention_groups 45 $PY -m bench.attention_groups --device cuda --dtype bfloat16
[ "$(left)" -gt 60 ] && step first_touch 60 $PY -m bench.first_touch --device cuda --dtype bfloat16
[ "$(left)" -gt 90 ] && step step_stalls 90 $PY -m bench.step_stalls --device cuda --dtype bfloat16 --workload code \
    --temperature 0 --concurrency 32 --runs 2 --trace  # every step's times, tokens and passes, for offline analysis
[ "$(left)" -gt 150 ] && step roofline 150 $PY -m bench.decode --device cuda --dtype bfloat16 --shape llama-3.2-3b \
    --concurrency 1,16 --new-tokens 128
sweep_cell code 0.7 1  # over 110 s on an H100: last
# this run's results and logs in one file (the device tool returns at most 8 files); the tails are printed above
find bench/results -name '*cuda*' -newer "$stamp" -print0 | xargs -0 tar czf "$OUT/results.tgz" "$OUT"/*.log \
    && rm -f "$OUT"/*.log
echo "done after $((SECONDS - start))s"
