"""Attention heat maps for one sentence, per layer and head, like the paper's Figures 3 to 5: encoder
self-attention, decoder self-attention and encoder-decoder (cross) attention of the model's own translation."""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.alignment_vaswani import forced_attentions
from .source_lines import source_limit

LABELLED = 40  # most tokens a panel labels, one per row and column
FIGURE_INCHES = 48  # a whole map's longer side at most: 3,840 pixels at its 80 dpi
KINDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}


def attention_weights(model, tokenizer, sentence: str, **generate_kwargs) -> dict:
    """Translate `sentence` (the model's decoding defaults), then run the pair once with eager attention and
    return the tokens and, per kind, a (layers, heads, queries, keys) tensor. A sentence longer than the model
    reads is cut to it, as `vaswani translate` cuts one."""
    limit = source_limit(model, tokenizer)
    batch = tokenizer([sentence], return_tensors="pt", truncation=True, max_length=limit).to(model.device)
    with torch.no_grad():
        generated = model.generate(**batch, **generate_kwargs)
        decoder_input_ids = generated[:, :-1] if generated.shape[1] > 1 else generated
        outputs = forced_attentions(model, **batch, decoder_input_ids=decoder_input_ids)
    stack = {
        "encoder": outputs.encoder_attentions,
        "decoder": outputs.decoder_attentions,
        "cross": outputs.cross_attentions,
    }
    source_tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    target_tokens = tokenizer.convert_ids_to_tokens(decoder_input_ids[0].tolist())
    return {
        "source_tokens": source_tokens,
        "target_tokens": target_tokens,
        "translation": tokenizer.decode(generated[0], skip_special_tokens=True).strip(),
        **{kind: torch.stack([layer[0] for layer in layers]).float().cpu() for kind, layers in stack.items()},
    }


def plot_attention(weights: dict, kind: str, path: str | Path, layers: list[int] | None = None) -> Path:
    """One PNG: a grid of heat maps, a row per layer and a column per head (queries down, keys across).

    The PNG's `Description` text chunk records `layers=L heads=H` so tools can check what it shows."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the attention maps need matplotlib: pip install matplotlib") from None
    maps = weights[kind]
    rows = layers if layers is not None else list(range(maps.shape[0]))
    heads = maps.shape[1]
    queries = weights["source_tokens"] if kind == "encoder" else weights["target_tokens"]
    keys = weights["target_tokens"] if kind == "decoder" else weights["source_tokens"]
    tokens = max(len(queries), len(keys))
    size = panel_inches(tokens, heads, len(rows))
    figure, axes = plt.subplots(len(rows), heads, figsize=(size * heads, size * len(rows)), squeeze=False)
    labelled = tokens <= min(LABELLED, size / 0.12)  # 6-point labels need about 0.12 in each
    for r, layer in enumerate(rows):
        for head in range(heads):
            axis = axes[r][head]
            axis.imshow(maps[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axis.set_xticks([])
            axis.set_yticks([])
            if r == 0:
                axis.set_title(f"head {head + 1}", fontsize=8)
            if head == 0:
                axis.set_ylabel(f"layer {layer + 1}", fontsize=8)
            if labelled and r == len(rows) - 1:
                axis.set_xticks(range(len(keys)), keys, rotation=90, fontsize=6)
            if labelled and head == 0:
                axis.set_yticks(range(len(queries)), queries, fontsize=6)
    figure.suptitle(title(kind, weights["translation"], size * heads), fontsize=9)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80, metadata={"Title": KINDS[kind], "Description": f"layers={len(rows)} heads={heads}"})
    plt.close(figure)
    return path


def panel_inches(tokens: int, heads: int, layers: int) -> float:
    """A panel's side in inches: room for its tokens' labels (0.22 in each, up to 40 tokens), 2.5 in past them
    (nothing is labelled), and the whole grid within FIGURE_INCHES. An untrained model's output runs to its length
    limit: panels that grew with it made PNGs 23,302 pixels wide that took a minute each to draw."""
    size = max(1.6, 0.22 * tokens) if tokens <= LABELLED else 2.5
    return min(size, FIGURE_INCHES / max(heads, layers))


def title(kind: str, translation: str, inches: float) -> str:
    """The map's title, one line of 9-point text (about 13 characters an inch), the translation cut to the
    figure's width: matplotlib does not wrap, and a longer line ran off both edges, the kind's name with it."""
    head = f"{KINDS[kind]}: "
    room = max(8, int(13 * inches) - len(head))
    return head + (translation if len(translation) <= room else translation[: room - 3] + "...")


def write_attention_maps(model, tokenizer, sentence: str, prefix: str | Path, **generate_kwargs) -> list[Path]:
    """`{prefix}-encoder.png`, `{prefix}-decoder.png`, `{prefix}-cross.png` for `sentence`."""
    weights = attention_weights(model, tokenizer, sentence, **generate_kwargs)
    return [plot_attention(weights, kind, f"{prefix}-{kind}.png") for kind in KINDS]
