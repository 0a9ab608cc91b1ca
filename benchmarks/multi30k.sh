#!/usr/bin/env bash
# The paper's recipe at small scale: the `small` preset on Multi30k en->de (29k pairs) on a 2-core CPU within 60 minutes
# of wall time. Trains with token-budget batches and a shared 8k BPE, evaluates test2016 with beam 4 (GNMT alpha 0.6,
# source + 50) at every second checkpoint, averages the last 5 checkpoints, scores the averaged model, and plots BLEU
# against wall time.
#
#   bash benchmarks/multi30k.sh            # data from ../shared/data/multi30k_en_de, results in benchmarks/results/
#   DATA=/path/to/multi30k OUT=/tmp/run MINUTES=50 EXTRA="--max_eval_samples 100" bash benchmarks/multi30k.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DATA="${DATA:-$here/../../shared/data/multi30k_en_de}"
OUT="${OUT:-$here/results/multi30k-run}"
MINUTES="${MINUTES:-52}"   # training incl. checkpoint evaluations; + ~2 min data/BPE setup and the final evaluation
RESULTS="${RESULTS:-$here/results}"
mkdir -p "$RESULTS"
start=$(date +%s)
vaswani train --data "$DATA" --src en --tgt de --eval_split test2016 \
    --preset small --vocab_size 8000 --dropout 0.1 --label_smoothing 0.1 \
    --max_tokens 2500 --learning_rate 1e-3 --warmup_steps 800 \
    --max_train_minutes "$MINUTES" --max_steps 1000000 \
    --save_strategy steps --save_steps 300 --average_last 5 \
    --eval_strategy steps --eval_steps 600 --per_device_eval_batch_size 100 \
    --logging_steps 100 --disable_tqdm true --seed 1 \
    --output_dir "$OUT" --overwrite_output_dir ${EXTRA:-} | tee "$RESULTS/multi30k.log"
end=$(date +%s)
python "$here/plot_bleu.py" "$OUT" "$RESULTS/multi30k.log" --wall-seconds $((end - start)) \
    --png "$RESULTS/multi30k_bleu.png" --markdown "$RESULTS/multi30k.md"
