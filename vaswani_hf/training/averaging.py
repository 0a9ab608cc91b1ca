"""Checkpoint averaging (section 6.1): the base model averages its last 5 checkpoints, the big model its last 20."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# written into a checkpoint saved at a stop (a signal, --max_train_minutes) rather than by the save schedule
STOP_MARKER = "stopped_here.json"
logger = logging.getLogger(__name__)


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete `checkpoint-N` folders of a training run, oldest (lowest step) first."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such folder; give the --output_dir of a training run.")
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found)]


def last_checkpoints(run_dir: str | Path, n: int, option: str) -> list[Path]:
    """The last `n` complete checkpoints of a run (for `option`, the flag that asked); a warning says when the run
    wrote fewer, rather than averaging fewer in silence.

    A checkpoint written at a stop is left out once the run has been resumed past it: it is off the save schedule,
    and counting it would shift the span (the last 5 of a run stopped at update 3,314 would start at 3,300, not
    3,000). The latest checkpoint of a run that is still stopped counts."""
    found = list_checkpoints(run_dir)
    skipped = [c for c in found[:-1] if (c / STOP_MARKER).is_file()]
    if skipped:
        logger.info("%s: left out %s, written when the run was stopped (off the save schedule)", option,
                    ", ".join(c.name for c in skipped))  # fmt: skip
    found = [c for c in found if c not in skipped][-n:]
    if len(found) < n:
        outcome = f"the final model averages {len(found)}" if found else "nothing is averaged"
        logger.warning("%s %d: the run wrote %d checkpoint(s), so %s. Save more often (--save_steps) to average as "
                       "many as asked.", option, n, len(found), outcome)  # fmt: skip
    return found


def load_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """The weights of one checkpoint folder, from `model.safetensors` or its sharded index."""
    checkpoint = Path(checkpoint)
    single, index = checkpoint / "model.safetensors", checkpoint / "model.safetensors.index.json"
    try:
        if single.is_file():
            return load_file(single)
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return {k: v for shard in shards for k, v in load_file(checkpoint / shard).items()}
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{checkpoint}: cannot read the weights ({err}); the file is truncated or corrupt.") from None
    raise FileNotFoundError(f"{checkpoint} holds no model.safetensors: it is not a complete checkpoint.")


def average_checkpoints(checkpoints: Sequence[str | Path], output_dir: str | Path) -> Path:
    """Average the weights of `checkpoints` element-wise (in float64) and save a normal, loadable float32 model.

    Config, generation config and tokenizer come from the last checkpoint."""
    if not checkpoints:
        raise ValueError("no checkpoints to average: train with --save_strategy steps (or epoch) first.")
    checkpoints = [Path(c) for c in checkpoints]
    total: dict[str, torch.Tensor] = {}
    for checkpoint in checkpoints:
        weights = load_weights(checkpoint)
        if total and weights.keys() != total.keys():
            raise ValueError(f"{checkpoint} holds different tensors than {checkpoints[0]}: not the same model.")
        for name, tensor in weights.items():
            total[name] = total[name] + tensor.double() if name in total else tensor.double()
    # float32 even from bf16 checkpoints (`--precision bf16` on CPU): their average is not a bf16 number
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1], dtype=torch.float32)
    averaged = {name: (value / len(checkpoints)).float() for name, value in total.items()}
    unexpected = model.load_state_dict(averaged, strict=False).unexpected_keys
    if unexpected:
        raise ValueError(f"{checkpoints[-1]}: weights the model does not have: {unexpected[:5]}")
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    if (checkpoints[-1] / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(checkpoints[-1]).save_pretrained(output_dir)
    (output_dir / "averaged_from.json").write_text(json.dumps([str(c) for c in checkpoints], indent=2) + "\n")
    return output_dir
