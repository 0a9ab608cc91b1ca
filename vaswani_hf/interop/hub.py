"""Sharing on the Hugging Face Hub: a model card filled from the training run's facts, and `push`.

The training run writes `training_facts.json` (architecture, data, tokenizer, every hyper-parameter, time and
hardware, BLEU/chrF with signatures) and a `README.md` card rendered from `model_cards/template.md`; `push`
re-renders the card for the repository it uploads to and sends weights, config, generation config, the two code
files, tokenizer and card in one commit.
"""

from __future__ import annotations

import json
import logging
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import transformers
from huggingface_hub import CommitInfo, EvalResult, HfApi, ModelCard, ModelCardData

from ..model.precision import cpu_name
from ..tasks import DEFAULT, task_named

logger = logging.getLogger(__name__)

FACTS_FILE = "training_facts.json"
ATTENTION_IMAGE = "attention-cross.png"
# What a shared model needs, and nothing of the run (checkpoints, optimizer state, logs, hypotheses).
PUSHED_FILES = ["*.safetensors", "model.safetensors.index.json", "config.json", "generation_config.json",
                "*_vaswani.py", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "README.md", FACTS_FILE, ATTENTION_IMAGE]  # fmt: skip
PAPER_ARXIV = "1706.03762"


def card_template() -> str:
    """`model_cards/template.md`, installed as the `vaswani_hf.model_cards` package data."""
    return (resources.files("vaswani_hf.model_cards") / "template.md").read_text(encoding="utf-8")


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU: {cpu_name()}, {torch.get_num_threads()} threads"


def training_facts(model, tokenizer, training_args, data: dict, stats: dict, metrics: dict) -> dict[str, Any]:
    """Everything the card states, from the run itself (no hand-typed numbers)."""
    config = model.config
    return {
        "model": {
            "parameters": model.num_parameters(),
            "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
            "d_model": config.d_model, "d_ff": config.encoder_ffn_dim, "heads": config.encoder_attention_heads,
            "d_k": config.attention_head_size(config.encoder_attention_heads), "dropout": config.dropout,
            "positions": config.position_embedding_type, "norm": config.norm_position,
            "vocab_size": config.vocab_size, "shared_embeddings": config.tie_word_embeddings,
        },
        "data": data,
        "decoding": {name: getattr(model.generation_config, name, None)
                     for name in ("num_beams", "length_penalty", "length_penalty_type", "max_length_offset")},
        "tokenizer": {"type": "shared source-target BPE (tokenizers)", "size": len(tokenizer)},
        "training": {
            "steps": stats["steps"], "seconds": stats["seconds"], "target_tokens_per_s": stats["target_tokens_per_s"],
            "world_size": training_args.world_size, "max_tokens": training_args.max_tokens,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
            "peak_learning_rate": training_args.learning_rate, "warmup_steps": training_args.warmup_steps,
            "schedule": training_args.lr_scheduler_type.value if hasattr(training_args.lr_scheduler_type, "value")
            else str(training_args.lr_scheduler_type),
            "adam": [training_args.adam_beta1, training_args.adam_beta2, training_args.adam_epsilon],
            "label_smoothing": training_args.label_smoothing_factor, "max_grad_norm": training_args.max_grad_norm,
            "seed": training_args.seed, "averaged": stats.get("averaged", []),
            "precision": str(training_args.precision_choice),
            "hardware": hardware(), "torch": torch.__version__, "transformers": transformers.__version__,
            "train_loss": stats.get("train_loss"),
        },
        "evaluation": metrics,
    }  # fmt: skip


def _decoding(decoding: dict | None) -> str:
    """The decoding settings the evaluation used, in words, from the model's generation config."""
    if not decoding:
        return "the model's generation config"
    penalty = ("GNMT length penalty alpha" if decoding.get("length_penalty_type") == "gnmt"
               else "length penalty |Y| **")  # fmt: skip
    limit = (f"maximum length source + {decoding['max_length_offset']}" if decoding.get("max_length_offset")
             is not None else "Transformers' max_length")  # fmt: skip
    return f"beam {decoding.get('num_beams')}, {penalty} {decoding.get('length_penalty')}, {limit}"


def _rows(facts: dict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    m, t = facts["model"], facts["training"]
    architecture = [
        ("parameters", f"{m['parameters'] / 1e6:.2f}M"),
        ("layers (encoder + decoder)", f"{m['encoder_layers']} + {m['decoder_layers']}"),
        ("d_model / d_ff / heads / d_k", f"{m['d_model']} / {m['d_ff']} / {m['heads']} / {m['d_k']}"),
        ("positions", {"sinusoidal": "sinusoidal, interleaved sin/cos (paper)",
                       "sinusoidal_split": "sinusoidal, sin half then cos half", "learned": "learned"}[m["positions"]]),
        ("layer norm", "post-norm (paper)" if m["norm"] == "post" else "pre-norm"),
        ("residual dropout", str(m["dropout"])),
        ("vocabulary", f"{m['vocab_size']}, embeddings shared by source, target and output projection"
         if m["shared_embeddings"] else str(m["vocab_size"])),
    ]  # fmt: skip
    batch = (f"{t['max_tokens']} padded tokens per side and process" if t["max_tokens"]
             else f"{t['per_device_train_batch_size']} sentence pairs per process")  # fmt: skip
    beta1, beta2, eps = t["adam"]
    hyperparameters = [
        ("batch", f"{batch} x {t['world_size']} process(es) x {t['gradient_accumulation_steps']} accumulation"),
        ("optimizer", f"Adam(beta1={beta1}, beta2={beta2}, eps={eps}), no weight decay"),
        ("learning rate", f"peak {t['peak_learning_rate']:.3g}, {t['schedule']} after {t['warmup_steps']:g} warmup "
                          "steps (paper: d_model^-0.5 min(step^-0.5, step warmup^-1.5))"),
        ("gradient clipping", "none (paper)" if not t["max_grad_norm"] else str(t["max_grad_norm"])),
        ("label smoothing", str(t["label_smoothing"])),
        ("steps", str(t["steps"])),
        ("checkpoint averaging", ", ".join(t["averaged"]) if t["averaged"] else "none"),
        ("precision", t.get("precision") or ("bf16 autocast" if t.get("bf16") else "fp32")),  # older facts: "bf16"
        ("seed", str(t["seed"])),
    ]  # fmt: skip
    return architecture, hyperparameters


def build_model_card(facts: dict, repo_id: str, model_name: str | None = None) -> ModelCard:
    """Render `model_cards/template.md` with the run's facts; `repo_id` is what the usage example loads."""
    data, evaluation, t = facts["data"], facts.get("evaluation") or {}, facts["training"]
    src, tgt = data.get("src"), data.get("tgt")
    eval_results = None
    dataset_type = data.get("dataset_id") or re.sub(r"[^a-z0-9]+", "-", data["name"].lower()).strip("-")
    if "bleu" in evaluation:
        eval_results = [
            EvalResult(task_type="translation", task_name=f"Translation {src}-{tgt}",
                       dataset_type=dataset_type, dataset_name=data["name"],
                       dataset_split=evaluation["split"], metric_type=metric, metric_name=metric_name,
                       metric_value=evaluation[metric], metric_config=evaluation[f"{metric}_signature"])
            for metric, metric_name in (("bleu", "BLEU (sacreBLEU)"), ("chrf", "chrF (sacreBLEU)"))
        ]  # fmt: skip
    name = model_name or repo_id.rstrip("/").split("/")[-1]
    task = task_named(data.get("task", DEFAULT))
    card_data = ModelCardData(
        model_name=name, language=task.card_languages(src, tgt), license="apache-2.0",
        library_name="transformers", pipeline_tag="translation",
        tags=[task.hub_tag, "vaswani", "transformer", f"arxiv:{PAPER_ARXIV}"],
        datasets=[data["dataset_id"]] if data.get("dataset_id") else None,
        metrics=list(task.hub_metrics), eval_results=eval_results,
    )  # fmt: skip
    evalb = None
    if "evalb_f1" in evaluation:
        evalb = {
            name: round(evaluation[f"evalb_{name}"], 2)
            for name in ("f1", "recall", "precision", "complete_match", "tagging_accuracy", "error_sentences")
        }
    doing = task.card_doing(src, tgt)
    architecture, hyperparameters = _rows(facts)
    minutes = t["seconds"] / 60
    return ModelCard.from_template(
        card_data,
        template_str=card_template(),
        repo_id=repo_id,
        model_name=name,
        summary=f"A {facts['model']['parameters'] / 1e6:.1f}M-parameter Transformer {doing}, trained on "
        f"{data['name'] if task.card_names_data else data['description']}.",
        parser=task.card_decodes_trees,
        evalb=evalb,
        decoding_description=_decoding(facts.get("decoding")),
        example_source=data["example"][0],
        example_target=data["example"][1],
        architecture=architecture,
        hyperparameters=hyperparameters,
        data_description=f"{data['description']}: {data['train_pairs']:,} training pairs after dropping empty pairs "
        f"and pairs longer than {data['max_length']} tokens.",
        tokenizer_description=f"{facts['tokenizer']['type']}, {facts['tokenizer']['size']:,} tokens, saved as a "
        "`PreTrainedTokenizerFast` beside the weights.",
        training_description=f"Trained for {t['steps']:,} steps in {minutes:.1f} minutes on {t['hardware']} "
        f"({t['target_tokens_per_s']:,} target tokens/s; final training loss {t['train_loss']}), with torch "
        f"{t['torch']} and transformers {t['transformers']}.",
        evaluation_description=f"{task.card_metric_description} on `{evaluation.get('split')}`, decoded with "
        f"{_decoding(facts.get('decoding'))}.",
        eval_split=evaluation.get("split"),
        eval_samples=evaluation.get("samples"),
        bleu=evaluation.get("bleu"),
        chrf=evaluation.get("chrf"),
        brevity_penalty=evaluation.get("brevity_penalty"),
        bleu_signature=evaluation.get("bleu_signature"),
        chrf_signature=evaluation.get("chrf_signature"),
        attention_image=data.get("attention_image"),
        intended_use=data["intended_use"],
        limitations=data["limitations"],
    )


def write_model_card(model_dir: str | Path, repo_id: str | None = None) -> ModelCard:
    """(Re)write `README.md` in `model_dir` from its `training_facts.json`."""
    model_dir = Path(model_dir)
    facts = json.loads((model_dir / FACTS_FILE).read_text())
    if (model_dir / ATTENTION_IMAGE).is_file():
        facts["data"]["attention_image"] = ATTENTION_IMAGE
    card = build_model_card(facts, repo_id or str(model_dir))
    card.save(model_dir / "README.md")
    return card


def write_training_card(trainer, data_args, stats: dict, metrics: dict, source: str, builtin: bool, task: str) -> None:
    """What `vaswani train` leaves beside the model: training_facts.json, the attention map of one evaluation
    sentence (`source`, the first of the evaluation split), and the README.md model card."""
    from ..translation.attention import write_attention_maps
    from ..translation.inference import translate

    training_args = trainer.args
    output_dir = Path(training_args.output_dir)
    model, tokenizer = trainer.model, trainer.processing_class
    example = (source, translate(model, tokenizer, [source], progress=False)[0])
    run_task = data_args.run_task
    name, use, limits = run_task.card_use(data_args, builtin, len(trainer.train_dataset))
    data = {"name": name, "task": run_task.name, "dataset_id": data_args.dataset_name,
            "description": task, "src": data_args.src,
            "tgt": data_args.tgt, "train_pairs": len(trainer.train_dataset), "max_length": data_args.max_length,
            "example": example, "intended_use": use, "limitations": limits}  # fmt: skip
    evaluation = {**metrics, "split": data_args.eval_split} if metrics else {}
    facts = training_facts(model, tokenizer, training_args, data, stats, evaluation)
    (output_dir / FACTS_FILE).write_text(json.dumps(facts, indent=2) + "\n")
    try:
        write_attention_maps(model, tokenizer, source, output_dir / "attention")
    except ImportError as err:
        logger.warning("no attention map in the model card: %s", err)
    write_model_card(output_dir)


def push(
    model_dir: str | Path,
    repo_id: str,
    private: bool = False,
    revision: str | None = None,
    token: str | None = None,
    commit_message: str | None = None,
) -> CommitInfo:
    """Upload a saved model folder in one commit: weights (safetensors), config with `auto_map`, generation
    config, the remote code (the `*_vaswani.py` files of PUSHED_FILES), tokenizer, card. Unchanged files are not
    sent again. The token comes from `token`, `HF_TOKEN` or `hf auth login`, as everywhere in huggingface_hub."""
    from ..translation.inference import load_for_inference

    model_dir = Path(model_dir)
    model, _ = load_for_inference(model_dir, device="cpu")  # refuses incomplete or mismatched folders
    if not (model_dir / "pipeline_vaswani.py").is_file():
        model.save_pretrained(model_dir)  # older saves: add the code files, auto_map and the translation pipeline
    if (model_dir / FACTS_FILE).is_file():
        write_model_card(model_dir, repo_id)
    elif not (model_dir / "README.md").is_file():
        raise FileNotFoundError(
            f"{model_dir} has no {FACTS_FILE} (written by `vaswani train`) and no README.md: write a model card "
            "before sharing the model."
        )
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    return api.upload_folder(
        repo_id=repo_id,
        folder_path=model_dir,
        revision=revision,
        allow_patterns=PUSHED_FILES,
        commit_message=commit_message or f"Upload {os.path.basename(os.path.abspath(model_dir))} with vaswani push",
    )
