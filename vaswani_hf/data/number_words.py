"""The built-in task: English number words to German number words, generated on the fly, offline.

"three hundred twenty-one , seven" -> "dreihunderteinundzwanzig , sieben". German puts units before tens
("einundzwanzig"), so the model must learn reordering, not a word-for-word copy.
"""

from __future__ import annotations

import random

EN_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()  # noqa: E501
EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
DE_ONES = "null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn".split()  # noqa: E501
DE_TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()


def english(n: int) -> str:
    """American English words for 0 <= n <= 999 ("three hundred twenty-one")."""
    hundreds, rest = divmod(n, 100)
    words = [f"{EN_ONES[hundreds]} hundred"] if hundreds else []
    if rest or not hundreds:
        tens, ones = divmod(rest, 10)
        words.append(EN_ONES[rest] if rest < 20 else EN_TENS[tens] + (f"-{EN_ONES[ones]}" if ones else ""))
    return " ".join(words)


def german(n: int) -> str:
    """German number word for 0 <= n <= 999, written as one word ("dreihunderteinundzwanzig")."""
    hundreds, rest = divmod(n, 100)
    word = ("ein" if hundreds == 1 else DE_ONES[hundreds]) + "hundert" if hundreds else ""
    if rest or not hundreds:
        tens, ones = divmod(rest, 10)
        if rest < 20:
            word += DE_ONES[rest]
        else:
            word += (("ein" if ones == 1 else DE_ONES[ones]) + "und" if ones else "") + DE_TENS[tens]
    return word


def number_pairs(count: int, seed: int, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """`count` distinct sentence pairs of 1 to 4 numbers below 1000, none of whose sources are in `exclude`."""
    rng = random.Random(seed)
    pairs, seen = [], set(exclude or ())
    while len(pairs) < count:
        numbers = [rng.randrange(1000) for _ in range(rng.randint(1, 4))]
        source = " , ".join(english(n) for n in numbers)
        if source in seen:
            continue
        seen.add(source)
        pairs.append((source, " , ".join(german(n) for n in numbers)))
    return pairs


def builtin_splits(train_size: int = 20000, test_size: int = 500) -> dict[str, list[tuple[str, str]]]:
    """Train / validation / test splits of the built-in task; held-out sources never occur in training."""
    train = number_pairs(train_size, seed=0)
    seen = {source for source, _ in train}
    val = number_pairs(test_size, seed=1, exclude=seen)
    seen |= {source for source, _ in val}
    return {"train": train, "val": val, "test": number_pairs(test_size, seed=2, exclude=seen)}
