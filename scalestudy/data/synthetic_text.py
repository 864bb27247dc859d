"""A deterministic, learnable stand-in for a text corpus: English-like UTF-8 prose, made offline.

Sentences come from a small stochastic grammar over a few hundred words (subject-verb agreement,
adjectives, prepositional phrases, relative clauses, reported speech, questions), grouped into
paragraphs separated by blank lines. Word choices follow Zipf-like weights, so a byte-level LM
first learns spelling and spacing, then the frequent words, then the grammar: its loss falls from
ln(256) ~ 5.5 nats to well under 2.5 within a few hundred steps, and keeps falling slowly after.
A few words carry accented letters, so the bytes include multi-byte UTF-8 sequences.

Only `random.Random.random()` draws the choices: Python guarantees its sequence for a seed across
versions, so the same seed gives the same bytes.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import random
from collections.abc import Iterator, Sequence

from scalestudy.atomic import atomic_path
from scalestudy.data import file_digests
from scalestudy.progress import Progress

log = logging.getLogger("scalestudy.data.textcorpus")

# fmt: off
# (singular, plural)
NOUNS = [
    ("cat", "cats"), ("dog", "dogs"), ("child", "children"), ("teacher", "teachers"),
    ("farmer", "farmers"), ("doctor", "doctors"), ("king", "kings"), ("queen", "queens"),
    ("bird", "birds"), ("horse", "horses"), ("student", "students"), ("sailor", "sailors"),
    ("baker", "bakers"), ("painter", "painters"), ("soldier", "soldiers"), ("stranger", "strangers"),
    ("woman", "women"), ("man", "men"), ("girl", "girls"), ("boy", "boys"), ("friend", "friends"),
    ("neighbour", "neighbours"), ("captain", "captains"), ("merchant", "merchants"),
    ("fox", "foxes"), ("wolf", "wolves"), ("mouse", "mice"), ("goose", "geese"), ("fisherman", "fishermen"),
    ("writer", "writers"), ("singer", "singers"), ("engineer", "engineers"), ("pilot", "pilots"),
    ("gardener", "gardeners"), ("rabbit", "rabbits"), ("owl", "owls"), ("clerk", "clerks"),
    ("priest", "priests"), ("miller", "millers"), ("weaver", "weavers"), ("hunter", "hunters"),
    ("maître d'", "maîtres d'"), ("protégé", "protégés"),
]
THINGS = [
    ("book", "books"), ("letter", "letters"), ("apple", "apples"), ("house", "houses"),
    ("boat", "boats"), ("stone", "stones"), ("song", "songs"), ("key", "keys"), ("map", "maps"),
    ("lamp", "lamps"), ("coat", "coats"), ("bell", "bells"), ("loaf", "loaves"), ("knife", "knives"),
    ("box", "boxes"), ("cup", "cups"), ("ring", "rings"), ("window", "windows"), ("door", "doors"),
    ("garden", "gardens"), ("river", "rivers"), ("bridge", "bridges"), ("story", "stories"),
    ("basket", "baskets"), ("candle", "candles"), ("wheel", "wheels"), ("clock", "clocks"),
    ("feather", "feathers"), ("coin", "coins"), ("cake", "cakes"), ("rope", "ropes"),
    ("crêpe", "crêpes"), ("résumé", "résumés"),
]
PLACES = [
    "the market", "the village", "the old mill", "the harbour", "the forest", "the city",
    "the school", "the castle", "the river bank", "the hill", "the kitchen", "the garden",
    "the station", "the library", "the bakery", "the church", "the meadow", "the bridge",
    "the café", "the tower", "the farm", "the square", "the shore", "the valley",
]
NAMES = [
    "Anna", "Tom", "Maria", "Peter", "Lucy", "James", "Clara", "Henry", "Emma", "Oscar", "Rosa",
    "Daniel", "Ida", "Felix", "Nora", "Hugo", "Zoë", "José", "Chloé", "Søren",
]
ADJECTIVES = [
    "old", "young", "small", "big", "happy", "tired", "clever", "quiet", "brave", "kind", "busy",
    "little", "green", "red", "dark", "bright", "strange", "careful", "hungry", "gentle", "proud",
    "lazy", "quick", "cold", "warm", "famous", "poor", "rich", "honest", "curious", "naïve",
]
THING_ADJECTIVES = [
    "old", "new", "small", "big", "red", "blue", "heavy", "light", "broken", "golden", "wooden",
    "strange", "beautiful", "empty", "secret", "round", "long", "little", "dusty", "shiny",
]
# (third person singular, plural, past)
TRANSITIVE = [
    ("sees", "see", "saw"), ("finds", "find", "found"), ("takes", "take", "took"),
    ("carries", "carry", "carried"), ("wants", "want", "wanted"), ("likes", "like", "liked"),
    ("holds", "hold", "held"), ("opens", "open", "opened"), ("loses", "lose", "lost"),
    ("brings", "bring", "brought"), ("sells", "sell", "sold"), ("buys", "buy", "bought"),
    ("paints", "paint", "painted"), ("hides", "hide", "hid"), ("keeps", "keep", "kept"),
    ("makes", "make", "made"), ("mends", "mend", "mended"), ("gives away", "give away", "gave away"),
]
PERSON_VERBS = [
    ("meets", "meet", "met"), ("helps", "help", "helped"), ("follows", "follow", "followed"),
    ("calls", "call", "called"), ("visits", "visit", "visited"), ("thanks", "thank", "thanked"),
    ("watches", "watch", "watched"), ("teaches", "teach", "taught"), ("greets", "greet", "greeted"),
    ("remembers", "remember", "remembered"), ("waits for", "wait for", "waited for"),
]
INTRANSITIVE = [
    ("sleeps", "sleep", "slept"), ("laughs", "laugh", "laughed"), ("sings", "sing", "sang"),
    ("runs", "run", "ran"), ("waits", "wait", "waited"), ("works", "work", "worked"),
    ("walks", "walk", "walked"), ("dances", "dance", "danced"), ("cries", "cry", "cried"),
    ("rests", "rest", "rested"), ("smiles", "smile", "smiled"), ("listens", "listen", "listened"),
]
SPEECH_VERBS = [("says", "say", "said"), ("thinks", "think", "thought"), ("knows", "know", "knew")]
ADVERBS = [
    "slowly", "quickly", "quietly", "happily", "carefully", "again", "today", "every morning",
    "at night", "once more", "in the evening", "without a word", "with a smile", "all day",
]
PREPOSITIONS = ["in", "near", "behind", "beside", "across", "outside", "above", "below", "by"]
CONNECTIVES = ["and", "but", "so", "because", "while", "although"]
OPENERS = [
    "Then", "Later", "In the morning", "After a while", "One day", "At last", "Meanwhile",
    "Suddenly", "That evening", "Long ago",
]
PERSON_DETERMINERS = (("the", "a", "that", "every"), ("the", "some", "those", "many"))  # singular, plural
THING_DETERMINERS = ("the", "some", "two", "three")
# fmt: on


def _zipf(count: int) -> list[float]:
    """Cumulative Zipf weights (1/rank) for `count` choices: early entries are the frequent ones."""
    return list(itertools.accumulate(1.0 / rank for rank in range(1, count + 1)))


class Grammar:
    """Sentences and paragraphs drawn with one `random.Random`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self._cumulative: dict[int, list[float]] = {}

    def pick(self, choices: Sequence):
        weights = self._cumulative.setdefault(len(choices), _zipf(len(choices)))
        index = bisect.bisect_right(weights, self.rng.random() * weights[-1])
        return choices[min(index, len(choices) - 1)]

    def chance(self, probability: float) -> bool:
        return self.rng.random() < probability

    def person(self) -> tuple[str, bool]:
        """(noun phrase, plural) naming people or animals."""
        if self.chance(0.25):
            return self.pick(NAMES), False
        plural = self.chance(0.3)
        words = f"{self.pick(ADJECTIVES)} " if self.chance(0.4) else ""
        words += self.pick(NOUNS)[plural]
        return _with_determiner(self.pick(PERSON_DETERMINERS[plural]), words), plural

    def thing(self) -> str:
        plural = self.chance(0.3)
        words = f"{self.pick(THING_ADJECTIVES)} " if self.chance(0.5) else ""
        words += self.pick(THINGS)[plural]
        determiner = self.pick(THING_DETERMINERS) if plural else ("the" if self.chance(0.5) else "a")
        return _with_determiner(determiner, words)

    def verb_phrase(self, plural: bool, past: bool, depth: int) -> str:
        def form(verb: tuple[str, str, str]) -> str:
            return verb[2] if past else verb[1 if plural else 0]

        roll = self.rng.random()
        if roll < 0.35:
            phrase = f"{form(self.pick(TRANSITIVE))} {self.thing()}"
        elif roll < 0.6:
            phrase = f"{form(self.pick(PERSON_VERBS))} {self.person()[0]}"
        elif roll < 0.85 or depth > 0:
            phrase = form(self.pick(INTRANSITIVE))
        else:
            return f"{form(self.pick(SPEECH_VERBS))} that {self.clause(depth + 1)}"
        if self.chance(0.35):
            phrase += f" {self.pick(PREPOSITIONS)} {self.pick(PLACES)}"
        if self.chance(0.3):
            phrase += f" {self.pick(ADVERBS)}"
        return phrase

    def clause(self, depth: int = 0) -> str:
        subject, plural = self.person()
        past = self.chance(0.5)
        if depth == 0 and self.chance(0.15):
            relative = self.verb_phrase(plural, past, depth + 1)
            subject = f"{subject} who {relative}"
        return f"{subject} {self.verb_phrase(plural, past, depth)}"

    def sentence(self) -> str:
        roll = self.rng.random()
        if roll < 0.08:
            subject, plural = self.person()
            verb = self.pick(TRANSITIVE)[1]
            text = f"{'do' if plural else 'does'} {subject} {verb} {self.thing()}?"
        elif roll < 0.16:
            speaker, plural = self.person()
            said = "said" if self.chance(0.7) else ("say" if plural else "says")
            quote = _capitalised(self.clause())
            return f'"{quote}," {said} {speaker}.'
        else:
            text = self.clause()
            if self.chance(0.25):
                text += f", {self.pick(CONNECTIVES)} {self.clause(depth=1)}"
            if self.chance(0.15):
                text = f"{self.pick(OPENERS)}, {text}"
            text += "!" if self.chance(0.05) else "."
        return _capitalised(text)

    def paragraph(self) -> str:
        count = 2 + int(self.rng.random() * 6)
        return " ".join(self.sentence() for _ in range(count)) + "\n\n"

    def paragraphs(self) -> Iterator[str]:
        while True:
            yield self.paragraph()


def _with_determiner(determiner: str, words: str) -> str:
    if determiner == "a" and words[0] in "aeiou":
        determiner = "an"
    return f"{determiner} {words}"


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def generate(n_bytes: int, seed: int) -> Iterator[bytes]:
    """The corpus as UTF-8 chunks of exactly `n_bytes` bytes in all.

    The last chunk is cut at a character boundary and padded with newlines, so the bytes are valid
    UTF-8 and their count is exact.
    """
    if n_bytes < 1:
        raise ValueError(f"the text corpus needs at least 1 byte, got {n_bytes}")
    written = 0
    for paragraph in Grammar(seed).paragraphs():
        chunk = paragraph.encode()
        if written + len(chunk) >= n_bytes:
            last = chunk[: n_bytes - written].decode(errors="ignore").encode()
            yield last.ljust(n_bytes - written, b"\n")
            return
        written += len(chunk)
        yield chunk


def write_corpus(path: str | os.PathLike, n_bytes: int, seed: int) -> str:
    """Write `n_bytes` bytes of the corpus for `seed` to `path` atomically; return its sha256."""
    progress = Progress("generate synthetic text", n_bytes, unit="B", logger=log)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            for chunk in generate(n_bytes, seed):
                handle.write(chunk)
                progress.advance(len(chunk))
        digest = file_digests(tmp, ("sha256",))["sha256"]
    log.info("synthetic text corpus: seed %d, %d bytes, sha256 %s", seed, n_bytes, digest)
    return digest
