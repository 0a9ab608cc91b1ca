#!/usr/bin/env bash
# One lent GPU, one call of about nine minutes: everything a GPU session measures and checks, written under $OUT.
#   1. benchmarks/gpu.py: decoding against Marian on the same card (graphed search on a first call, which captures,
#      and on later calls, which replay kept graphs), and the training step (eager, compiled, `--speedups auto`'s
#      trial, chunked_loss among its candidates); a torch.profiler table of one beam-4 batch-64 call, eager and graphed;
#   2. a WMT-shaped corpus of 1M pairs (open vocabulary) prepared with `vaswani prepare`, then
#      benchmarks/train_pipeline.py: `vaswani train` against its bare step at the paper's batch;
#   3. benchmarks/parsing.py: the built-in treebank's parser trained and scored on the card (`--task parse`, beam 21
#      with the tree constraint, which runs the eager search);
#   4. the whole default test suite with CUDA visible, with the time left (pytest-xdist; each result logged as it
#      comes, so a suite cut short still says what passed).
# Wheels and make_corpus.py travel in $CARRY: the image has torch but not our versions of the rest. On 2026-11-28
# (image: torch 2.11.0+cu130, transformers 5.17.0, no datasets, evaluate, fastapi) this set served: transformers
# tokenizers datasets dill multiprocess fsspec evaluate fastapi starlette pydantic pydantic-core typing-inspection
# annotated-types typing-extensions opentelemetry-api uvicorn httptools python-multipart prometheus-client
# parameterized libretranslatepy, at the versions of the local environment (pip download --no-deps, cp312).
# The arguments name the parts to run (default: all four, in one call; the suite then gets what the measurements
# leave, so a session that needs the whole suite on the card gives it a call of its own: `suite`).
#
#   bash benchmarks/gpu_session.sh                        # on the device machine: decoding training parse suite
#   bash benchmarks/gpu_session.sh parse suite            # some parts only, in this order
#   bash benchmarks/gpu_session.sh suite                  # the suite alone, with the whole call's time
#   GPU_SESSION_DRY=1 bash benchmarks/gpu_session.sh      # its parts on a CPU, tiny: a dry run before the lease
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
CARRY=${CARRY:-.carry}
BUDGET=${GPU_SESSION_SECONDS:-540}
DRY=${GPU_SESSION_DRY:-0}
PARTS=" ${*:-decoding training parse suite} "
mkdir -p "$OUT"
left() { echo $((BUDGET - SECONDS)); }
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/session.log"; }

if ls "$CARRY"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$CARRY"/*.whl >>"$OUT/session.log" 2>&1 && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >>"$OUT/session.log" 2>&1
fi
python3 - <<'EOF' | tee -a "$OUT/session.log"
import platform, torch, transformers, datasets, tokenizers, pyarrow
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA"
print(f"{name}; torch {torch.__version__}, CUDA {torch.version.cuda}, Transformers {transformers.__version__}, "
      f"datasets {datasets.__version__}, tokenizers {tokenizers.__version__}, pyarrow {pyarrow.__version__}, "
      f"Python {platform.python_version()}, {torch.get_num_threads()} CPU threads")
EOF

if [ "$DRY" = 1 ]; then
    GPU=(--quick --device cpu --cases train greedy-b1 beam4-b1)
    PAIRS=5000 PIPELINE=(--preset tiny --steps 2 4 --max-tokens 512 --bare-shape 16 32 --precision fp32)
    SUITE=(tests/test_graph_decoding.py -k "kept or bucket or replay")
    PROFILE_ARGS="tiny cpu"
    PARSE=(--train_args "--max_steps 4")
else
    GPU=(--rounds 5)
    PAIRS=1000000 PIPELINE=(--steps 40 160 --run-timeout 150)
    SUITE=(-n 15)
    PROFILE_ARGS="base cuda"
    PARSE=()
fi

if [[ $PARTS == *" decoding "* ]]; then
say "1. decoding and the training step against Marian"
timeout 300 python3 benchmarks/gpu.py "${GPU[@]}" --out "$OUT/gpu.md" >>"$OUT/session.log" 2>&1 || say "gpu.py: exit $?"
# shellcheck disable=SC2086
timeout 60 python3 - $PROFILE_ARGS >"$OUT/profile.txt" 2>&1 <<'EOF' || say "profile: exit $?"
import sys, torch
sys.path.insert(0, "benchmarks")
from compare_marian import PRESETS, batch, build_marian
from vaswani_hf.interop.convert import marian_to_vaswani
preset, device = sys.argv[1], torch.device(sys.argv[2])
PRESETS.setdefault("tiny", dict(vocab_size=500, d_model=32, layers=2, heads=4, ffn=64))
model = marian_to_vaswani(build_marian(preset)).to(device).eval()
source = batch(preset, 64, 24, seed=3).to(device)
for graphs in (False, True):
    run = lambda: model.generate(input_ids=source, num_beams=4, min_new_tokens=40, max_new_tokens=40,
                                 max_length_offset=None, length_penalty_type="hf", graph_decoding=graphs)
    run(), run()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as profile:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(f"## beam 4, batch 64, 40 tokens, graph_decoding={graphs}\n")
    print(profile.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=60))
EOF

fi

if [[ $PARTS == *" training "* ]]; then
say "2. a WMT-shaped corpus, vaswani prepare, vaswani train against its bare step"
CORPUS=/tmp/gpu_session_corpus PREPARED=/tmp/gpu_session_prepared
rm -rf "$CORPUS" "$PREPARED"
MAKE_CORPUS=$CARRY/make_corpus.py
[ -f "$MAKE_CORPUS" ] || MAKE_CORPUS=../shared/scale/make_corpus.py
timeout 120 python3 "$MAKE_CORPUS" "$CORPUS" "$PAIRS" --vocab open >>"$OUT/session.log" 2>&1 || say "corpus: exit $?"
TQDM_DISABLE=1 /usr/bin/env time -v timeout 180 python3 -m vaswani_hf.cli prepare --data "$CORPUS" --src en --tgt de \
    --vocab_size 32000 --bpe_sample_lines 300000 --output_dir "$PREPARED" \
    >>"$OUT/session.log" 2>&1 || say "prepare: exit $?"
timeout 330 python3 benchmarks/train_pipeline.py --data "$PREPARED" "${PIPELINE[@]}" --logs /tmp/gpu_session_runs \
    --out "$OUT/train_pipeline.md" --train-args --profile_steps 30 >>"$OUT/session.log" 2>&1 \
    || say "train_pipeline: exit $?"
tail -n 5 /tmp/gpu_session_runs/*.log >>"$OUT/session.log" 2>&1
cp /tmp/gpu_session_runs/*.log "$OUT/" 2>/dev/null  # each run's log holds its step profile (--profile_steps)

fi

if [[ $PARTS == *" parse "* ]]; then
say "3. the built-in treebank's parser, trained and scored"
timeout -k 10 300 python3 benchmarks/parsing.py --output_dir /tmp/gpu_session_parse "${PARSE[@]}" \
    >"$OUT/parse.txt" 2>>"$OUT/session.log" || say "parsing.py: exit $?"
cat "$OUT/parse.txt" >>"$OUT/session.log"
fi

[[ $PARTS == *" suite "* ]] || exit 0
say "4. the default suite with CUDA visible, $(left) s left: the CUDA runs first, then the rest"
for part in gpu rest; do
    if [ "$part" = gpu ]; then marks=(-m "gpu and not slow"); else marks=(-m "not gpu and not slow"); fi
    [ "$DRY" = 1 ] && marks=()
    timeout "$(( $(left) > 30 ? $(left) : 30 ))" python3 -m pytest "${SUITE[@]}" "${marks[@]}" -v -p no:cacheprovider \
        -rfE >"$OUT/suite-$part.log" 2>&1
    say "suite ($part): exit $? ($(grep -c ' PASSED' "$OUT/suite-$part.log") passed," \
        "$(grep -c ' FAILED' "$OUT/suite-$part.log") failed lines); $(tail -n 1 "$OUT/suite-$part.log")"
done
