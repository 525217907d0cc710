"""The built-in corpus (data.source=builtin): small English-like documents with real structure.

A fixed "world" of named animals with attributes gives facts that recur across documents (learnable
by memorization), templates give local structure, and arithmetic, counting and lists give
dependencies a model must carry across a sentence (the sum, the next number, how many items were
announced). Documents are drawn from the world with `random.Random(seed)`, so a seed fixes the
corpus; the world itself never changes, so facts agree across seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Bump when the generator changes: app/components/data/lm/tokens.py puts it in the token cache key.
CORPUS_VERSION = 1

_COLORS = ("red", "blue", "green", "gray", "brown", "white", "black", "golden")
_ANIMALS = ("fox", "owl", "bear", "deer", "wolf", "hare", "crow", "otter", "mole", "frog")
_PLACES = (
    "north forest",
    "south hills",
    "east river",
    "west marsh",
    "old mill",
    "deep cave",
    "tall grass",
    "cold lake",
)
_FOODS = ("berries", "fish", "nuts", "seeds", "roots", "mice", "honey", "apples", "worms", "leaves")
_SIZES = ("small", "large", "tiny", "big")
_TRAITS = ("quick", "shy", "brave", "lazy", "clever", "loud", "quiet", "calm")
_TIMES = ("at dawn", "at night", "at noon", "in the evening")
_ITEMS = (
    "bread",
    "milk",
    "eggs",
    "salt",
    "rope",
    "nails",
    "soap",
    "rice",
    "tea",
    "candles",
    "string",
    "paper",
)
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


@dataclass(frozen=True)
class _Entity:
    color: str
    animal: str
    place: str
    food: str
    size: str
    trait: str
    time: str
    friend: str  # another entity's name: a fact that links two entities

    @property
    def name(self) -> str:
        return f"the {self.color} {self.animal}"


def _build_world(num_entities: int = 40) -> list[_Entity]:
    rng = random.Random(20240601)  # fixed: the facts are part of the corpus definition
    pairs = [(c, a) for c in _COLORS for a in _ANIMALS]
    chosen = rng.sample(pairs, num_entities)
    names = [f"the {c} {a}" for c, a in chosen]
    return [
        _Entity(
            color=c,
            animal=a,
            place=rng.choice(_PLACES),
            food=rng.choice(_FOODS),
            size=rng.choice(_SIZES),
            trait=rng.choice(_TRAITS),
            time=rng.choice(_TIMES),
            friend=rng.choice([n for n in names if n != f"the {c} {a}"]),
        )
        for c, a in chosen
    ]


_WORLD = _build_world()


def _entity_sentences(e: _Entity) -> list[str]:
    return [
        f"{e.name} lives in the {e.place} and eats {e.food}.",
        f"{e.name} is {e.size} and {e.trait}.",
        f"{e.name} wakes up {e.time}.",
        f"{e.name} is a friend of {e.friend}.",
        f"every day {e.name} looks for {e.food} near the {e.place}.",
    ]


def _story(rng: random.Random) -> str:
    e = rng.choice(_WORLD)
    sentences = _entity_sentences(e)
    rng.shuffle(sentences)
    return " ".join(sentences[: rng.randint(2, len(sentences))])


def _questions(rng: random.Random) -> str:
    lines = []
    for e in rng.sample(_WORLD, rng.randint(2, 4)):
        q, a = rng.choice(
            [
                (f"where does {e.name} live?", f"in the {e.place}."),
                (f"what does {e.name} eat?", f"{e.food}."),
                (f"when does {e.name} wake up?", f"{e.time}."),
                (f"who is the friend of {e.name}?", f"{e.friend}."),
            ]
        )
        lines.append(f"q: {q} a: {a}")
    return "\n".join(lines)


def _arithmetic(rng: random.Random) -> str:
    facts = []
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        if rng.random() < 0.5:
            facts.append(f"{a} plus {b} is {a + b}.")
        else:
            hi, lo = max(a, b), min(a, b)
            facts.append(f"{hi} minus {lo} is {hi - lo}.")
    return " ".join(facts)


def _counting(rng: random.Random) -> str:
    start, step, n = rng.randint(0, 50), rng.choice((1, 1, 2, 5, 10)), rng.randint(5, 10)
    seq = ", ".join(str(start + i * step) for i in range(n))
    return f"counting by {step} from {start}: {seq}."


def _shopping_list(rng: random.Random) -> str:
    items = rng.sample(_ITEMS, rng.randint(2, 6))
    owner = rng.choice(_WORLD).name
    # The announced count must match the list: a dependency across the whole sentence.
    return f"{owner} needs {_NUMBER_WORDS[len(items)]} things: {', '.join(items)}."


def _spelling(rng: random.Random) -> str:
    word = rng.choice(_ANIMALS + _FOODS)
    return f"the word {word} is spelled {'-'.join(word)}."


_GENERATORS = (
    (_story, 4),
    (_questions, 2),
    (_arithmetic, 2),
    (_counting, 1),
    (_shopping_list, 1),
    (_spelling, 1),
)


def generate_corpus(num_docs: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    funcs = [f for f, _ in _GENERATORS]
    weights = [w for _, w in _GENERATORS]
    return [rng.choices(funcs, weights)[0](rng) for _ in range(num_docs)]
