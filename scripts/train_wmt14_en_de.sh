#!/usr/bin/env bash
# The paper's base model on WMT14 English->German (sections 5 and 6), on one machine with 8 GPUs.
#
# Data:   WMT14 en-de from the Hugging Face Hub (`wmt14`, config `de-en`: ~4.5M training pairs; validation =
#         newstest2013), a shared BPE vocabulary of 37,000 tokens trained by the run itself.
# Recipe: 25,000 source + 25,000 target tokens per step (3,125 per GPU, padded), 100,000 steps, Adam(0.9, 0.98, 1e-9),
#         warmup 4,000 then inverse square root, label smoothing 0.1, dropout 0.1, a checkpoint every 1,500 steps
#         (~10 minutes at the paper's 0.4 s/step), the last 5 averaged; beam 4, alpha 0.6, max length source + 50.
# Expect: the paper took 12 hours on 8 P100s; it reports 27.3 BLEU (tokenized, compound-split) on newstest2014.
#         Detokenized sacreBLEU (what this prints) typically reads ~0.5-1 point lower than that for the same output.
# Fewer GPUs: keep 25,000 tokens per step with --gradient_accumulation_steps (e.g. 4 GPUs: 2; 1 GPU: 8).
#
#   bash scripts/train_wmt14_en_de.sh [extra `vaswani train` options]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-runs/wmt14-en-de-base}"
TEST="${TEST:-$here/../../shared/data/wmt14_newstest2014}"
accelerate launch --config_file "$here/accelerate/ddp-8gpu.yaml" -m vaswani_hf.cli train \
    --dataset_name wmt14 --dataset_config_name de-en --src en --tgt de \
    --train_split train --eval_split validation --vocab_size 37000 --max_length 256 \
    --preset base --max_tokens 3125 --max_steps 100000 --warmup_steps 4000 \
    --save_strategy steps --save_steps 1500 --average_last 5 \
    --tf32 true --dataloader_num_workers 2 --logging_steps 100 \
    --output_dir "$OUT" "$@"
# newstest2014, the paper's test set, from ../shared/data (files newstest2014.en-de.{en,de}).
vaswani evaluate "$OUT" --data "$TEST" --split newstest2014.en-de --src en --tgt de --batch-size 128
