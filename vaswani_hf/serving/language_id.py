"""Which language a text is in, for LibreTranslate's `/detect` and `source: auto`: py3langid (a maintained fork of
langid.py, whose naive Bayes model over byte n-grams ships inside the package: nothing is downloaded, 97 languages,
well under a millisecond a sentence). A model translates one source language, but the answer stays honest:
German sent to an English model is reported as German.

`source: auto` refuses a text only when the identifier is sure of it (`Settings.detect_threshold`, 0.9 by default)
on enough text (`Settings.detect_min_chars`, 20) and the language is not the model's source; shorter or ambiguous
text is translated, since the identifier is guessing there (py3langid gives 'Hallo' 2% as Italian)."""

from __future__ import annotations

from functools import cache


@cache
def identifier():
    """The identifier with probabilities normalised to sum to 1 (loaded once: about 0.6 s)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def detect(text: str, fallback: str, candidates: int = 3) -> list[dict]:
    """LibreTranslate's answer: the likeliest languages, best first, as {"confidence": 0-100, "language": code};
    for text with no letters, `fallback` with confidence 0 (LibreTranslate says English then)."""
    if not any(character.isalpha() for character in text):
        return [{"confidence": 0.0, "language": fallback}]
    ranked = identifier().rank(text)[:candidates]
    # the best is never under 1/97 (probabilities over 97 languages): the cut drops only the also-rans
    return [{"confidence": round(float(p) * 100, 1), "language": code} for code, p in ranked if p >= 0.005]
