"""Built-in prompt-pair tasks, seeded and deterministic: ``induction``, ``ioi`` and ``brackets``.

induction  r = n random tokens; clean = [bos] r r[:n−1], answer r[n−1] (the repeat's next token);
           corrupt = [bos] r r'[:n−1] (the second half replaced by fresh tokens r'), wrong = r'[n−1].
           Any model (token ids only).
ioi        Indirect object identification (Wang et al. 2022): "When Mary and John went to the store, John gave
           a drink to" → " Mary" (the indirect object), wrong " John" (the subject), in ABBA and BABA order;
           corrupt: the same template with three other names (their "ABC" distribution). Names must be single
           tokens, so this is a task for GPT-2's tokenizer (each name is checked against the one given).
brackets   Closing a call's bracket, which the shipped stdlib model does: "os.join(path" → ")", wrong "]";
           corrupt "os.join[path" (favours "]"). Pairs of several templates, hence several lengths.

Every prompt starts as the model's tokenizer starts a text: with its BOS token where it puts one (Gemma's
``<bos>``; ``bos`` of ``induction``), with none for GPT-2's. Answers and names are bare tokens.
"""

from __future__ import annotations

import random

from headprune.errors import HeadpruneError
from headprune.patching.pairs import PromptPairs

TASKS = ("induction", "ioi", "brackets")
#: What each task's pairs are, for the report.
TASK_TEXT = {
    "induction": "Induction: random tokens repeated once, the answer the repeat's next token; corrupt: the second "
                 "half replaced by other random tokens",
    "ioi": "Indirect object identification (Wang et al. 2022): the answer the indirect object, wrong the subject; "
           "corrupt: three other names",
    "brackets": "Closing a call's bracket: the answer \")\" after \"f(x\", wrong \"]\"; corrupt: \"f[x\"",
}

# Names that are one GPT-2 token with their leading space (checked against the tokenizer when used).
NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sarah", "Paul", "Anna", "Mark", "Lisa", "David", "Kate", "Mike",
         "Emma", "Jack", "Laura", "Peter", "Amy", "Chris", "Rose", "Adam", "Jane", "Steve", "Alice")
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "station", "park")
OBJECTS = ("drink", "book", "ring", "bag", "key", "letter", "gift", "ball")
# {A} is the indirect object (the answer), {B} the subject (named twice); the prompt stops before the answer.
IOI_TEMPLATES = (
    "When {A} and {B} went to the {place}, {B} gave a {obj} to",
    "Then, {A} and {B} were working at the {place}. {B} decided to give a {obj} to",
    "After {A} and {B} went to the {place}, {B} handed a {obj} to",
    "While {A} and {B} were at the {place}, {B} passed a {obj} to",
    "Friends {A} and {B} found a {obj} at the {place}. {B} gave it to",
)
MODULES = ("os", "sys", "json", "re", "math", "time", "path", "self")
FUNCS = ("join", "split", "open", "get", "append", "format", "read", "write", "encode", "call")
ARGS = ("path", "name", "data", "key", "value", "self", "args", "obj", "text", "x")
BRACKET_TEMPLATES = ("{mod}.{f}({a}", "Return {f}({a}", "the {f}({b}) and {f}({a}", "{mod}.{f}({a}, {b}")


def induction(vocab_size: int, n_pairs: int = 32, half: int = 10, seed: int = 0, bos: int | None = None,
              low: int = 1) -> PromptPairs:
    """Repeated random tokens (ids low..vocab_size−1, no id twice in a pair); see the module docstring."""
    if half < 2 or vocab_size - low < 3 * half:
        raise HeadpruneError(f"induction needs half >= 2 and at least {3 * half} token ids above {low}")
    rng = random.Random(seed)
    clean, corrupt, answer, wrong = [], [], [], []
    prefix = [] if bos is None else [bos]
    for _ in range(n_pairs):
        drawn = rng.sample(range(low, vocab_size), 2 * half)
        r, r2 = drawn[:half], drawn[half:]
        clean.append(prefix + r + r[:-1])
        corrupt.append(prefix + r + r2[:-1])
        answer.append(r[-1])
        wrong.append(r2[-1])
    return PromptPairs.from_lists(clean, corrupt, answer, wrong, "induction")


def _single(tokenizer, words: tuple[str, ...]) -> list[tuple[str, int]]:
    """(word, id) of the words that are one token with a leading space."""
    out = []
    for w in words:
        ids = tokenizer(" " + w, add_special_tokens=False)["input_ids"]
        if len(ids) == 1:
            out.append((w, ids[0]))
    return out


def _encode_pairs(tokenizer, texts: list[tuple[str, str, str, str]], name: str) -> PromptPairs:
    """Tokenize (clean, corrupt, answer, wrong) texts; a pair whose prompts differ in length is an error here."""
    clean, corrupt, answer, wrong = [], [], [], []
    for c, r, a, w in texts:
        ci, ri = tokenizer(c)["input_ids"], tokenizer(r)["input_ids"]  # as the tokenizer marks a text (Gemma: <bos>)
        ai, wi = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (a, w))
        if len(ci) != len(ri) or len(ai) != 1 or len(wi) != 1:
            raise HeadpruneError(f"{name}: {c!r} / {r!r} do not tokenize to equal lengths with one-token answers "
                                 "for this tokenizer")
        clean.append(ci)
        corrupt.append(ri)
        answer.append(ai[0])
        wrong.append(wi[0])
    return PromptPairs.from_lists(clean, corrupt, answer, wrong, name)


def ioi(tokenizer, n_pairs: int = 32, seed: int = 0) -> PromptPairs:
    """Wang et al.'s IOI prompts (see the module docstring), alternating ABBA and BABA."""
    names = [w for w, _ in _single(tokenizer, NAMES)]
    if len(names) < 5:
        raise HeadpruneError(f"ioi needs names that are one token each; this tokenizer has only {len(names)} of "
                             f"{len(NAMES)} (ioi is a task for GPT-2's tokenizer)")
    rng = random.Random(seed)
    texts = []
    for p in range(n_pairs):
        io, s, c1, c2, c3 = rng.sample(names, 5)
        template, place, obj = rng.choice(IOI_TEMPLATES), rng.choice(PLACES), rng.choice(OBJECTS)
        order = (lambda x, y: (x, y)) if p % 2 == 0 else (lambda x, y: (y, x))  # ABBA, then BABA
        first, second = order(io, s)
        clean = template.replace("{A} and {B}", f"{first} and {second}", 1).format(B=s, place=place, obj=obj)
        first_c, second_c = order(c1, c2)
        corrupt = template.replace("{A} and {B}", f"{first_c} and {second_c}", 1).format(B=c3, place=place, obj=obj)
        texts.append((clean, corrupt, " " + io, " " + s))
    return _encode_pairs(tokenizer, texts, "ioi")


def brackets(tokenizer, n_pairs: int = 32, seed: int = 0) -> PromptPairs:
    """Close a call's "(" with ")" (clean) against a subscript's "[" (corrupt), wrong "]"."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_pairs):
        template = rng.choice(BRACKET_TEMPLATES)
        a, b = rng.sample(ARGS, 2)
        clean = template.format(mod=rng.choice(MODULES), f=rng.choice(FUNCS), a=a, b=b)
        texts.append((clean, clean[: clean.rindex("(")] + "[" + clean[clean.rindex("(") + 1 :], ")", "]"))
    return _encode_pairs(tokenizer, texts, "brackets")


def task_pairs(name: str, model, tokenizer=None, n_pairs: int = 32, seed: int = 0) -> PromptPairs:
    """The built-in task ``name`` for ``model`` (a :class:`~headprune.models.base.HeadModel`); the text tasks
    tokenize with ``tokenizer`` (default: the model's own, :func:`headprune.io.read.tokenizer.model_tokenizer`)."""
    if name not in TASKS:
        raise HeadpruneError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    if name == "induction":
        bos = model.origin.bos_token_id
        pairs = induction(model.cfg.vocab_size, n_pairs, min(10, (model.cfg.n_positions - 1) // 2), seed, bos)
    else:
        if tokenizer is None:
            from headprune.io.read.tokenizer import model_tokenizer

            tokenizer = model_tokenizer(model)
        pairs = (ioi if name == "ioi" else brackets)(tokenizer, n_pairs, seed)
    return pairs.check(model.cfg.vocab_size, model.cfg.n_positions)
