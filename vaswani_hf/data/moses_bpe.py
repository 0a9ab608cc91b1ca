"""The tokenizer of fairseq's WMT models: Moses tokenization (sacremoses), then subword-nmt BPE with `@@ ` marking a
word's continuation, over fairseq's dictionary (<s>=0, <pad>=1, </s>=2, <unk>=3, then `dict.txt`'s lines).

It is the pipeline those models were trained on (Ott et al., 2018, prepared their data with Moses' `tokenizer.perl`
and subword-nmt), kept as those two libraries do it: the pieces equal `sacremoses` + `subword_nmt.apply_bpe` on the
same text (tests/test_convert_fairseq.py holds it to them on Multi30k and newstest2014). A source ends with </s> and
has no <s>, as fairseq's; `decode` joins the pieces and Moses-detokenises. `vaswani convert fairseq` writes it beside
the model (`vocab.json`, `bpecodes`, `tokenizer_config.json`); `AutoTokenizer.from_pretrained` loads it once
`vaswani_hf` is imported (which registers it, importing this module on first use). It needs
`pip install "vaswani-hf[fairseq]"` (sacremoses, subword-nmt).
"""

from __future__ import annotations

import json
import os

from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "vocab.json", "codes_file": "bpecodes"}
INSTALL = 'pip install "vaswani-hf[fairseq]" (sacremoses and subword-nmt)'


def _moses_and_bpe():
    try:
        import sacremoses
        from subword_nmt import apply_bpe
    except ImportError as err:
        raise ImportError(f"The Moses + BPE tokenizer of converted fairseq models needs {INSTALL}: {err}") from None
    return sacremoses, apply_bpe


class MosesBPETokenizer(PreTrainedTokenizer):
    """Moses + subword-nmt BPE over one vocabulary shared by source and target (fairseq's joined dictionary).

    Args:
        vocab_file: `vocab.json`, token -> id.
        codes_file: subword-nmt's codes (fairseq's `bpecodes` or `code`), merges in order.
        source_lang / target_lang: the Moses language of inputs and of `text_target` / decoded outputs.
        aggressive_dash_splits: Moses `-a` (split "self-evident" into "self @-@ evident").
        escape: Moses' XML escaping (`&quot;`, `&apos;`, ...) of inputs; `decode` unescapes either way, as fairseq.
        split_special_tokens (default True): `</s>`, `<pad>`, `<unk>`, `<s>` in a text are text, as in fairseq.
        normalize_punctuation: Moses' `normalize-punctuation.perl` before tokenizing.
        bpe_separator: the continuation mark BPE appends ("@@").
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        codes_file: str,
        source_lang: str = "en",
        target_lang: str = "de",
        aggressive_dash_splits: bool = True,
        escape: bool = True,
        normalize_punctuation: bool = False,
        bpe_separator: str = "@@",
        bos_token: str = "<s>",
        eos_token: str = "</s>",
        pad_token: str = "<pad>",
        unk_token: str = "<unk>",
        **kwargs,
    ) -> None:
        # fairseq reads `</s>`, `<pad>`, `<unk>`, `<s>` inside a line as text (Moses escapes and BPE segments them);
        # Transformers would cut them out as the special tokens themselves (an EOS in mid-source)
        kwargs.setdefault("split_special_tokens", True)
        sacremoses, apply_bpe = _moses_and_bpe()
        with open(vocab_file, encoding="utf-8") as handle:
            self.encoder: dict[str, int] = json.load(handle)
        self.decoder = {index: token for token, index in self.encoder.items()}
        with open(codes_file, encoding="utf-8") as handle:
            self.bpe = apply_bpe.BPE(handle, separator=bpe_separator)
        self.vocab_file, self.codes_file = vocab_file, codes_file
        self.source_lang, self.target_lang = source_lang, target_lang
        self.aggressive_dash_splits, self.escape = aggressive_dash_splits, escape
        self.normalize_punctuation, self.bpe_separator = normalize_punctuation, bpe_separator
        self._moses = {lang: sacremoses.MosesTokenizer(lang=lang) for lang in (source_lang, target_lang)}
        self._normalizers = {lang: sacremoses.MosesPunctNormalizer(lang=lang) for lang in (source_lang, target_lang)}
        self._detokenizer = sacremoses.MosesDetokenizer(lang=target_lang)
        self.lang = source_lang
        super().__init__(
            source_lang=source_lang,
            target_lang=target_lang,
            aggressive_dash_splits=aggressive_dash_splits,
            escape=escape,
            normalize_punctuation=normalize_punctuation,
            bpe_separator=bpe_separator,
            bos_token=bos_token,
            eos_token=eos_token,
            pad_token=pad_token,
            unk_token=unk_token,
            **kwargs,
        )

    # `tokenizer(text_target=...)` tokenizes labels in the target language
    def _switch_to_target_mode(self) -> None:
        self.lang = self.target_lang

    def _switch_to_input_mode(self) -> None:
        self.lang = self.source_lang

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    def get_vocab(self) -> dict[str, int]:
        return dict(self.encoder)

    def moses_tokenize(self, text: str, lang: str | None = None) -> list[str]:
        """Moses' words of `text` (punctuation normalised first where the model's data was)."""
        lang = lang or self.lang
        if self.normalize_punctuation:
            text = self._normalizers[lang].normalize(text)
        return self._moses[lang].tokenize(
            text, aggressive_dash_splits=self.aggressive_dash_splits, escape=self.escape, return_str=False
        )

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return self.bpe.segment_tokens(self.moses_tokenize(text))

    def _convert_token_to_id(self, token: str) -> int:
        return self.encoder.get(token, self.encoder[self.unk_token])

    def _convert_id_to_token(self, index: int) -> str:
        return self.decoder.get(index, self.unk_token)

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """As Transformers', but `<unk>` is kept when special tokens are skipped: fairseq prints it in a hypothesis
        (and tokenized BLEU counts it), where dropping it would hide a word the model could not spell."""
        if isinstance(ids, int) or not skip_special_tokens:
            return super().convert_ids_to_tokens(ids, skip_special_tokens=skip_special_tokens)
        skipped = set(self.all_special_ids) - {self.unk_token_id}
        return super().convert_ids_to_tokens([int(i) for i in ids if int(i) not in skipped])

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        words = " ".join(tokens).replace(f"{self.bpe_separator} ", "").split()
        if words and words[-1].endswith(self.bpe_separator):  # a cut-off piece: keep its letters
            words[-1] = words[-1][: -len(self.bpe_separator)]
        # unescaped whatever `escape` says, as fairseq's MosesTokenizer.decode (a model trained with escaping off
        # still spells `&quot;` where its training text had one)
        return self._detokenizer.detokenize(words, unescape=True)

    def build_inputs_with_special_tokens(self, token_ids_0: list[int], token_ids_1: list[int] | None = None):
        # fairseq: no <s>; every sequence ends with </s>
        if token_ids_1 is None:
            return token_ids_0 + [self.eos_token_id]
        return token_ids_0 + [self.eos_token_id] + token_ids_1 + [self.eos_token_id]

    def get_special_tokens_mask(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None, already_has_special_tokens: bool = False
    ) -> list[int]:
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, already_has_special_tokens=True)
        if token_ids_1 is None:
            return [0] * len(token_ids_0) + [1]
        return [0] * len(token_ids_0) + [1] + [0] * len(token_ids_1) + [1]

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, str]:
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        vocab_path = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["vocab_file"])
        codes_path = os.path.join(save_directory, prefix + VOCAB_FILES_NAMES["codes_file"])
        with open(vocab_path, "w", encoding="utf-8") as handle:
            json.dump(self.encoder, handle, ensure_ascii=False, indent=0)
        if os.path.abspath(codes_path) != os.path.abspath(self.codes_file):
            with open(self.codes_file, encoding="utf-8") as source, open(codes_path, "w", encoding="utf-8") as out:
                out.write(source.read())
        return vocab_path, codes_path


__all__ = ["MosesBPETokenizer"]
