"""The built-in treebank of the parsing task (section 6.3): English-like sentences and their Penn Treebank trees,
generated offline and deterministically, so `vaswani train --task parse` runs without the (licensed) WSJ files.

Like the number-words task (`vaswani_hf.data.number_words`) it is made to be learnable in minutes, so it is unambiguous
given the words. Every word has one part of speech ("dog" is always NN), and every attachment follows from them:
- a PP after a verb's object belongs to the verb only where the verb's class takes that PP ("placed the book on
  the table", "filled the box with water", "gave the book to him"); after any other verb it belongs to the noun
  ("saw the book on the table");
- noun modifiers (PP, relative clause, parenthesis) attach to the nearest noun phrase on their left;
- verb adjuncts (manner and time adverbs, after/before/during/until PPs, because/when/although clauses, "to"
  purpose clauses) attach to the lowest VP: a VP that holds a clause takes none;
- conjoined NPs are base NPs and the first conjunct of conjoined VPs or clauses holds no clause, so "and" joins
  the lowest phrase it can.
The gold trees carry what raw PTB files carry and `treebank.clean` removes: function tags and indices (NP-SBJ-1,
PP-CLR, S-TPC-2), traces and null elements ((-NONE- *T*-1), (-NONE- 0), (-NONE- *)), an empty top bracket.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

from .trees import Tree

# ---- the lexicon: each word has exactly one tag (checked below, when the module loads)
HUMANS = ("man woman child teacher doctor student farmer lawyer artist driver manager writer worker friend neighbor "
          "officer baker pilot nurse singer").split()  # fmt: skip
THINGS = ("dog cat bird horse car book table house garden box bag letter gift river city company window door bottle "
          "cake road bridge park hat chair picture song shelf wall truck boat key lamp ship phone").split()  # fmt: skip
MASS = "water sand money food rice oil milk bread".split()
_IRREGULAR = {"man": "men", "woman": "women", "child": "children", "shelf": "shelves", "city": "cities",
              "company": "companies"}  # fmt: skip
PLURALS = {n: _IRREGULAR.get(n, n + ("es" if n.endswith(("s", "x", "ch", "sh")) else "s")) for n in HUMANS + THINGS}
PERSONS = "Smith Jones Mary John Anna Peter Garcia Miller Wilson Taylor Clark".split()
PLACES = "Paris London Boston Chicago Texas Acme Globex Berlin Tokyo Madrid".split()
ADJECTIVES = ("old new big small red green happy young tall large little black white quiet busy strange famous "
              "heavy bright cold").split()  # fmt: skip
OF_ADJECTIVES = "proud afraid aware fond tired".split()  # only predicative, with an optional "of" complement
# verbs: "base past 3rd-singular[ preposition or particle]", one subcategorisation class each
VERBS = {
    "intrans": "sleep slept sleeps|arrive arrived arrives|laugh laughed laughs|smile smiled smiles|wait waited waits|"
    "fall fell falls|swim swam swims|run ran runs|dance danced dances|cry cried cries|stay stayed stays",
    "clr": "rely relied relies on|depend depended depends on|look looked looks at|talk talked talks about|"
    "agree agreed agrees with|listen listened listens to|search searched searches for|point pointed points at",
    "trans": "see saw sees|buy bought buys|like liked likes|find found finds|chase chased chases|visit visited visits|"
    "paint painted paints|watch watched watches|help helped helps|call called calls|meet met meets|follow followed "
    "follows|sell sold sells|build built builds|carry carried carries|open opened opens|admire admired admires|"
    "catch caught catches|wash washed washes",
    "particle": "pick picked picks up|throw threw throws away|turn turned turns off|write wrote writes down|"
    "clean cleaned cleans up|take took takes out|bring brought brings back",
    "put": "place placed places on|stack stacked stacks on|drop dropped drops on|hang hung hangs on|fill filled fills "
    "with|cover covered covers with|load loaded loads with|decorate decorated decorates with",
    "ditrans": "give gave gives|send sent sends|offer offered offers|show showed shows|hand handed hands|"
    "lend lent lends",
    "say": "say said says|believe believed believes|think thought thinks|know knew knows|claim claimed claims|"
    "argue argued argues|hear heard hears|explain explained explains",
    "control": "want wanted wants|try tried tries|decide decided decides|hope hoped hopes|refuse refused refuses|"
    "promise promised promises|need needed needs",
}
VERBS = {frame: [entry.split() for entry in entries.split("|")] for frame, entries in VERBS.items()}
FRAME_WEIGHTS = {"intrans": 14, "clr": 10, "trans": 24, "particle": 6, "put": 8, "ditrans": 8, "say": 6,
                 "control": 6, "copula": 12}  # fmt: skip
FRAME_BAG = [frame for frame, weight in FRAME_WEIGHTS.items() for _ in range(weight)]
SIMPLE_FRAME_BAG = [frame for frame in FRAME_BAG if frame not in ("say", "control")]  # frames without a clause
TENSES = ["past"] * 11 + ["pres"] * 5 + ["modal"] * 4
VERB_TAGS, VERB_FORMS = {"base": "VB", "past": "VBD", "pres": "VBZ"}, {"base": 0, "past": 1, "pres": 2}
COPULA = {"base": "be", "past": ("was", "were"), "pres": ("is", "are")}
MODALS = "will would can could should might must may".split()
SUBJECT_PRONOUNS, OBJECT_PRONOUNS = "he she it they we you".split(), "him them us it you".split()
PLURAL_PRONOUNS = {"they", "we", "you", "them", "us"}
NOUN_PREPS, LOC_PREPS, TIME_PREPS = "of with on in near from for".split(), "in near on behind".split(), (
    "after before during until".split())  # fmt: skip
MANNER, TIME, SENTENCE_ADVERBS = "quickly slowly carefully quietly loudly happily".split(), (
    "recently again soon later".split()), "also never often still".split()  # fmt: skip
DEGREE, APPROXIMATE = "very extremely quite really".split(), "nearly almost roughly".split()
NUMBERS, YEARS = "two three four five six ten twelve twenty fifty 12 20 45 300".split(), "1990 1995 2001 2010".split()
POSSESSIVES = "his their its our my your".split()
SINGULAR_DETS, PLURAL_DETS = "the a this every each no".split(), "the these some no".split()
SAY_IN_QUOTES, SPEAKERS = ["said", "explained", "argued", "claimed"], ["he", "she", "they"]

MAX_WORDS = 46  # a few sentences pass the len <= 40 cutoff of section 6.3's evaluation, none runs away
_VERB_WORDS = {tag: [entry[i] for entries in VERBS.values() for entry in entries] + extra
               for tag, i, extra in (("VB", 0, ["be"]), ("VBD", 1, ["was", "were"]), ("VBZ", 2, ["is"]))}  # fmt: skip
TAGGED = {"NN": HUMANS + THINGS + MASS, "NNS": list(PLURALS.values()), "NNP": PERSONS + PLACES, "MD": MODALS,
          "JJ": ADJECTIVES + OF_ADJECTIVES, "PRP": SUBJECT_PRONOUNS + OBJECT_PRONOUNS, "PRP$": POSSESSIVES,
          "IN": NOUN_PREPS + LOC_PREPS + TIME_PREPS + "at about because although that".split(),
          "RB": MANNER + TIME + SENTENCE_ADVERBS + DEGREE + APPROXIMATE, "CD": NUMBERS + YEARS + ["million"],
          "DT": SINGULAR_DETS + PLURAL_DETS + ["an"], "RP": [entry[3] for entry in VERBS["particle"]], **_VERB_WORDS,
          "VBP": ["are"], "TO": ["to"], "CC": ["and", "but", "or"], "WDT": ["which"], "WP": ["who"], "WRB": ["when"],
          "POS": ["'s"], ":": [";"], **{mark: [mark] for mark in ("``", "''", ",", ".", "-LRB-", "-RRB-")}}  # fmt: skip
LEXICON = {word: tag for tag, words in TAGGED.items() for word in words}  # the one tag of each word
if len(LEXICON) != sum(len(set(words)) for words in TAGGED.values()):
    raise AssertionError("a word is listed under two tags: here every word has one part of speech")


def _leaf(tag: str, word: str) -> Tree:
    return Tree(tag, [word])


def _node(label: str, *children: Tree) -> Tree:
    return Tree(label, list(children))


def _verb(entry: list[str], tense: str) -> Tree:
    """The verb's leaf: VB after a modal or "to", VBD, or VBZ (the present with a singular subject)."""
    return _leaf(VERB_TAGS[tense], entry[VERB_FORMS[tense]])


def _first_word(node: Tree) -> Tree:
    """The preterminal of the first word, quotation marks aside: "a" or "an" and the capital letter depend on it."""
    while not node.is_preterminal():
        node = next(c for c in node.children if isinstance(c, Tree) and c.label not in ("``", "-NONE-"))
    return node


def _article(det: str, words: list[Tree]) -> Tree:
    """The determiner: "a" is "an" before a vowel."""
    return _leaf("DT", "an" if det == "a" and _first_word(words[0]).children[0][0] in "aeiou" else det)


def _capitalize(tree: Tree) -> None:
    """Capitalise the sentence's (or the quotation's) first word, as written English does."""
    node = _first_word(tree)
    node.children[0] = node.children[0][:1].upper() + node.children[0][1:]


class _Generator:
    """The grammar; `index` numbers the traces of the sentence being built, `clauses` counts the clauses built
    (a VP whose complements hold one takes no adjuncts: they go to the lowest VP)."""

    def __init__(self, rng: random.Random):
        self.rng, self.index, self.clauses = rng, 0, 0

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, items):
        return items[int(self.rng.random() * len(items))]

    def trace_index(self) -> int:
        self.index += 1
        return self.index

    # ---- noun phrases: (tree, plural, human)
    def premodifiers(self) -> list[Tree]:
        """0 to 2 adjectives before the noun, a few with a degree adverb: (ADJP (RB very) (JJ old))."""
        adjectives = [_leaf("JJ", self.pick(ADJECTIVES)) for _ in range(self.pick((0, 0, 0, 0, 1, 1, 2)))]
        return [_node("ADJP", _leaf("RB", self.pick(DEGREE)), jj) if self.chance(0.12) else jj for jj in adjectives]

    def base_np(self, subject: bool = False, pronoun_ok: bool = True) -> tuple[Tree, bool, bool]:
        r = self.rng.random()
        if r < 0.1 and pronoun_ok:
            word = self.pick(SUBJECT_PRONOUNS if subject else OBJECT_PRONOUNS)
            return _node("NP", _leaf("PRP", word)), word in PLURAL_PRONOUNS, word != "it"
        if r < 0.22:
            name = self.pick(PERSONS + PLACES)
            return _node("NP", _leaf("NNP", name)), False, name in PERSONS
        if r < 0.24:
            return _node("NP", _leaf("NN", self.pick(MASS))), False, False
        human, plural = self.chance(0.45), self.chance(0.3)
        noun = self.pick(HUMANS if human else THINGS)
        words = [*self.premodifiers(), _leaf("NNS", PLURALS[noun]) if plural else _leaf("NN", noun)]
        if r < 0.3:  # a possessor: (NP (NP (DT the) (NN teacher) (POS 's)) (NN book))
            owner = [_leaf("NNP", self.pick(PERSONS))] if self.chance(0.4) else [
                _leaf("DT", "the"), _leaf("NN", self.pick(HUMANS))]  # fmt: skip
            words.insert(0, _node("NP", *owner, _leaf("POS", "'s")))
        elif r < 0.36:
            words.insert(0, _leaf("PRP$", self.pick(POSSESSIVES)))
        elif r < 0.44 and plural:  # numbers: (CD three), (QP (RB nearly) (CD 300)), (QP (CD 20) (CD million))
            number, r = _leaf("CD", self.pick(NUMBERS)), self.rng.random()
            words.insert(0, number if r < 0.7 else _node("QP", _leaf("RB", self.pick(APPROXIMATE)), number) if r < 0.88
                         else _node("QP", number, _leaf("CD", "million")))  # fmt: skip
        elif r >= 0.5 or not plural:  # else a bare plural
            words.insert(0, _article(self.pick(PLURAL_DETS if plural else SINGULAR_DETS), words))
        return _node("NP", *words), plural, human

    def full_np(self, depth: int = 0, clause_ok: bool = False, subject: bool = False) -> tuple[Tree, bool, bool]:
        """A base NP, or one with a PP, a relative clause or a parenthesis: modifiers go on a base NP only."""
        np, plural, human = self.base_np(subject)
        head = np.children[-1].label
        if head == "PRP":
            return np, plural, human
        r = self.rng.random()
        if r < 0.13 and depth < 2:
            preposition = _leaf("IN", self.pick(NOUN_PREPS))
            return _node("NP", np, _node("PP", preposition, self.full_np(depth + 1, clause_ok)[0])), plural, human
        if r < 0.19 and clause_ok:
            return _node("NP", np, self.relative(plural, human)), plural, human
        if r < 0.25 and head == "NNP":
            inside = _leaf("NNP", self.pick(PLACES)) if self.chance(0.5) else _leaf("CD", self.pick(YEARS))
            return _node("NP", np, _node("PRN", _leaf("-LRB-", "-LRB-"), _node("NP", inside),
                                         _leaf("-RRB-", "-RRB-"))), plural, human  # fmt: skip
        return np, plural, human

    def coordinated_np(self) -> Tree:
        """Two or three base NPs: (NP (NP ..) (, ,) (NP ..) (CC and) (NP ..)), plural."""
        conjuncts = [self.base_np(pronoun_ok=False)[0] for _ in range(self.rng.choice((2, 2, 3)))]
        children = [conjuncts[0]] + ([_leaf(",", ","), conjuncts[1]] if len(conjuncts) == 3 else [])
        return _node("NP", *children, _leaf("CC", self.pick(("and", "or"))), conjuncts[-1])

    def relative(self, plural: bool, human: bool) -> Tree:
        """(SBAR (WHNP-1 (WDT which)) (S (NP-SBJ (-NONE- *T*-1)) (VP ..))), or the object's trace."""
        k, self.clauses = self.trace_index(), self.clauses + 1
        wh = _node(f"WHNP-{k}", _leaf("WP", "who") if human else _leaf("WDT", "which"))
        tense = self.pick(("past", "past", "pres", "modal"))
        if self.chance(0.6):
            subject = _node("NP-SBJ", _leaf("-NONE-", f"*T*-{k}"))
            return _node("SBAR", wh, _node("S", subject, self.verb_phrase(plural, 2, tense, simple=True)))
        subject, subject_plural, _ = self.base_np(subject=True)
        subject.label = "NP-SBJ"
        tense = "past" if tense == "pres" and subject_plural else tense
        entry = self.pick(VERBS["trans"])
        vp = _node("VP", _verb(entry, "base" if tense == "modal" else tense), _node("NP", _leaf("-NONE-", f"*T*-{k}")))
        if tense == "modal":
            vp = _node("VP", _leaf("MD", self.pick(MODALS)), vp)
        return _node("SBAR", wh, _node("S", subject, vp))

    # ---- verbs and verb phrases
    def verb_phrase(self, plural: bool, depth: int, tense: str, subject: Tree | None = None,
                    simple: bool = False) -> Tree:  # fmt: skip
        """A VP; under a modal the verb's own VP is the lower one, which takes the complements and adjuncts."""
        if tense == "modal":
            return _node("VP", _leaf("MD", self.pick(MODALS)), self.verb_phrase(plural, depth, "base", subject, simple))
        frame = self.pick(SIMPLE_FRAME_BAG if simple or depth >= 2 else FRAME_BAG)
        if tense == "pres" and plural and frame != "copula":
            tense = "past"  # the present plural (VBP) would spell the bare verb, which is VB here
        clause_ok, clauses = not simple and depth < 2, self.clauses
        if frame == "copula":
            form = COPULA[tense] if tense == "base" else COPULA[tense][plural]
            children = [_leaf({"base": "VB", "past": "VBD", "pres": "VBP" if plural else "VBZ"}[tense], form)]
            r = self.rng.random()
            if r < 0.15:  # (ADJP-PRD (JJ proud) (PP (IN of) (NP ..)))
                of = [_node("PP", _leaf("IN", "of"), self.full_np(1)[0])] if self.chance(0.6) else []
                children.append(_node("ADJP-PRD", _leaf("JJ", self.pick(OF_ADJECTIVES)), *of))
            elif r < 0.5:  # (ADJP-PRD (RB very) (JJ happy))
                degree = [_leaf("RB", self.pick(DEGREE))] if self.chance(0.3) else []
                children.append(_node("ADJP-PRD", *degree, _leaf("JJ", self.pick(ADJECTIVES))))
            elif r < 0.75:
                noun = self.pick(HUMANS + THINGS)
                words = [*self.premodifiers(), _leaf("NNS", PLURALS[noun]) if plural else _leaf("NN", noun)]
                children.append(_node("NP-PRD", *words if plural else [_article("a", words), *words]))
            else:
                children.append(_node("PP-LOC-PRD", _leaf("IN", self.pick(LOC_PREPS)), self.full_np(0, clause_ok)[0]))
            vp = _node("VP", *children)
        else:
            entry = self.pick(VERBS[frame])
            vp = _node("VP", _verb(entry, tense))
            self.complements(vp, frame, entry, plural, depth, clause_ok, subject)
        if self.clauses == clauses:
            self.adjuncts(vp, depth, simple)
        return vp

    def complements(self, vp: Tree, frame: str, entry: list[str], plural: bool, depth: int, clause_ok: bool,
                    subject: Tree | None) -> None:  # fmt: skip
        add = vp.children.append
        if frame == "intrans" and self.chance(0.35):
            add(_node("PP-LOC", _leaf("IN", self.pick(LOC_PREPS)), self.full_np(0, clause_ok)[0]))
        elif frame == "clr":
            add(_node("PP-CLR", _leaf("TO" if entry[3] == "to" else "IN", entry[3]), self.full_np(0, clause_ok)[0]))
        elif frame == "trans":
            add(self.coordinated_np() if depth == 0 and self.chance(0.06) else self.full_np(0, clause_ok)[0])
        elif frame == "particle":
            particle = _node("PRT", _leaf("RP", entry[3]))
            obj = self.base_np()[0]
            shifted = obj.children[0].label == "PRP" or self.chance(0.4)  # "picked it up", "picked the book up"
            vp.children += [obj, particle] if shifted else [particle, self.full_np(0, clause_ok)[0]]
        elif frame == "put":  # "placed the book on the table": the verb's PP, after a base NP
            role = "PP-PUT" if entry[3] == "on" else "PP-CLR"
            goal = _node("NP", _leaf("NN", self.pick(MASS))) if entry[3] == "with" and self.chance(0.5) else (
                self.full_np(0, clause_ok)[0])  # fmt: skip
            vp.children += [self.base_np()[0], _node(role, _leaf("IN", entry[3]), goal)]
        elif frame == "ditrans":  # "gave the man the book", "gave the book to the man"
            first, second = self.base_np()[0], self.full_np(0, clause_ok)[0]
            vp.children += [first, second if self.chance(0.5) else _node("PP-DTV", _leaf("TO", "to"), second)]
        elif frame == "say":
            complementizer = _leaf("IN", "that") if self.chance(0.6) else _leaf("-NONE-", "0")
            add(_node("SBAR", complementizer, self.clause(depth + 1)))
        elif frame == "control":  # (S (NP-SBJ (-NONE- *-1)) (VP (TO to) (VP ..))), the subject NP-SBJ-1
            k, self.clauses = self.trace_index(), self.clauses + 1
            subject.label += f"-{k}"  # a control verb's VP is never simple, so it comes with its clause's subject
            inner = self.verb_phrase(plural, depth + 1, "base", simple=True)
            add(_node("S", _node("NP-SBJ", _leaf("-NONE-", f"*-{k}")), _node("VP", _leaf("TO", "to"), inner)))

    def adjuncts(self, vp: Tree, depth: int, simple: bool) -> None:
        """Manner adverb, time PP, time adverb, then at most one clause: a fixed order, all on this (lowest) VP."""
        add = vp.children.append
        if self.chance(0.1):
            add(_node("ADVP-MNR", _leaf("RB", self.pick(MANNER))))
        if self.chance(0.12):
            add(_node("PP-TMP", _leaf("IN", self.pick(TIME_PREPS)), self.full_np(1)[0]))
        if self.chance(0.05):
            add(_node("ADVP-TMP", _leaf("RB", self.pick(TIME))))
        if simple or depth >= 2:
            return
        r = self.rng.random()
        if r < 0.07:
            add(self.adverbial_clause(depth + 1))
        elif r < 0.1:  # (S-PRP (NP-SBJ (-NONE- *)) (VP (TO to) (VP ..))): "to" before a verb, never before an NP
            inner = self.verb_phrase(False, depth + 1, "base", simple=True)
            add(_node("S-PRP", _node("NP-SBJ", _leaf("-NONE-", "*")), _node("VP", _leaf("TO", "to"), inner)))

    def adverbial_clause(self, depth: int) -> Tree:
        """because (SBAR-PRP), although (SBAR-ADV), or when (SBAR-TMP, with WHADVP-k and its trace)."""
        kind = self.rng.randrange(3)
        if kind == 2:
            k = self.trace_index()
            clause = self.clause(depth, coordination_ok=False)
            vp = clause.children[-1]
            while vp.children[-1].label == "VP":  # the trace goes in the lowest VP, under a modal's
                vp = vp.children[-1]
            vp.children.append(_node("ADVP-TMP", _leaf("-NONE-", f"*T*-{k}")))
            return _node("SBAR-TMP", _node(f"WHADVP-{k}", _leaf("WRB", "when")), clause)
        label, word = (("SBAR-PRP", "because"), ("SBAR-ADV", "although"))[kind]
        return _node(label, _leaf("IN", word), self.clause(depth, coordination_ok=False))

    # ---- clauses and sentences
    def clause(self, depth: int, coordination_ok: bool = True, simple: bool = False) -> Tree:
        """(S (NP-SBJ ..) (ADVP ..)? (VP ..)); the first of two conjoined VPs holds no clause."""
        self.clauses += 1
        if depth == 0 and not simple and self.chance(0.06):
            subject, plural = self.coordinated_np(), True
        else:
            subject, plural, _ = self.full_np(0, clause_ok=not simple and depth < 2, subject=True)
        subject.label = "NP-SBJ"
        tense = self.pick(TENSES)
        adverb = [_node("ADVP", _leaf("RB", self.pick(SENTENCE_ADVERBS)))] if self.chance(0.05) else []
        children = [subject, *adverb]  # "He also said ..."
        if coordination_ok and not simple and depth < 2 and self.chance(0.07):
            first = self.verb_phrase(plural, depth, tense, subject, simple=True)
            second = self.verb_phrase(plural, depth, tense, subject)
            children.append(_node("VP", first, _leaf("CC", self.pick(("and", "but", "or"))), second))
        else:
            children.append(self.verb_phrase(plural, depth, tense, subject, simple))
        return _node("S", *children)

    def sentence(self) -> Tree:
        self.index = 0
        period, r = _leaf(".", "."), self.rng.random()
        speaker = _leaf("PRP", self.pick(SPEAKERS)) if self.chance(0.6) else _leaf("NNP", self.pick(PERSONS))
        said = _leaf("VBD", self.pick(SAY_IN_QUOTES))
        if r < 0.05:  # He said , `` The dog slept . ''
            quoted = self.clause(1, coordination_ok=False)
            _capitalize(quoted)
            vp = _node("VP", said, _leaf(",", ","), _leaf("``", "``"), quoted)
            s = _node("S", _node("NP-SBJ", speaker), vp, period, _leaf("''", "''"))
        elif r < 0.09:  # `` The dog slept , '' he said . : the quotation is the said-clause's topic
            k = self.trace_index()
            topic = self.clause(1, coordination_ok=False)
            topic.label = f"S-TPC-{k}"
            vp = _node("VP", said, _node("SBAR", _leaf("-NONE-", "0"), _node("S", _leaf("-NONE-", f"*T*-{k}"))))
            s = _node("S", _leaf("``", "``"), topic, _leaf(",", ","), _leaf("''", "''"), _node("NP-SBJ", speaker), vp,
                      period)  # fmt: skip
        elif r < 0.15:  # the first clause holds no clause, so the conjunction joins the top clauses
            first, second = self.clause(0, simple=True), self.clause(1, coordination_ok=False)
            joint = [_leaf(",", ",")] * self.chance(0.5) + [_leaf("CC", self.pick(("and", "but", "or")))]
            s = _node("S", first, *([_leaf(":", ";")] if self.chance(0.2) else joint), second, period)
        else:  # a clause, after an adverbial clause and a comma 6% of the time ("When the dog slept , he left .")
            s = self.clause(0)
            s.children[:0] = [self.adverbial_clause(1), _leaf(",", ",")] if r < 0.21 else []
            s.children.append(period)
        _capitalize(s)
        return Tree("", [s])


def generate_trees(count: int, seed: int, exclude: set[str] | None = None) -> list[Tree]:
    """`count` gold trees of distinct sentences (words joined by spaces not in `exclude`), raw as PTB files have
    them: function tags, traces, the empty top bracket. The same seed gives the same trees."""
    generator, trees, seen = _Generator(random.Random(seed)), [], set(exclude or ())
    collecting = gc.isenabled()
    gc.disable()  # the cycle collector would rescan the growing list of trees: 3x the time, and trees hold no cycles
    try:
        while len(trees) < count:
            tree = generator.sentence()
            sentence = " ".join(tree.words())
            if sentence.count(" ") < MAX_WORDS and sentence not in seen:
                seen.add(sentence)
                trees.append(tree)
    finally:
        if collecting:
            gc.enable()
    return trees


def builtin_treebank(train_size: int = 20000, test_size: int = 500) -> dict[str, list[Tree]]:
    """Train / dev / test splits of the built-in treebank; held-out sentences never occur in training."""
    train = generate_trees(train_size, seed=0)
    seen = {" ".join(tree.words()) for tree in train}
    dev = generate_trees(test_size, seed=1, exclude=seen)
    seen |= {" ".join(tree.words()) for tree in dev}
    return {"train": train, "dev": dev, "test": generate_trees(test_size, seed=2, exclude=seen)}


def write_treebank(folder: str | Path, splits: dict[str, list[Tree]]) -> list[Path]:
    """`{split}.trees` in `folder`, one tree a line in PTB brackets (`treebank.read_trees` reads them back)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    for split, trees in splits.items():
        (Path(folder) / f"{split}.trees").write_text("".join(f"{tree}\n" for tree in trees), encoding="utf-8")
    return [Path(folder) / f"{split}.trees" for split in splits]
