"""Whether answers say "not answerable" when they should: each shared set's questions asked of its own index
(answerable: the share marked not answerable is the miss rate) and of every other set's index (out of corpus:
the share marked not answerable is the catch rate), through `answer_question` offline on the auto route, as
the CLI answers. The support threshold is decided on the tune halves; the confirm halves report it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Sequence

from lazyhippo.evaluate.bench import DATASETS, ensure_index, select_split, split_of
from lazyhippo.settings import Settings

# the three multi-hop sets (corpus.jsonl) and git's AsciiDoc manual (a folder of .txt files)
ANSWER_SETS = {**DATASETS, "gitdocs": "gitdocs"}
# The targets a threshold must meet on the tune halves: answerable questions marked not answerable, at most
# MAX_MISSED on the sets' mean and MAX_MISSED_SET on any one set (a set of real documentation questions misses most);
# out-of-corpus questions marked not answerable, at least MIN_CAUGHT on the sets' mean.
MAX_MISSED = 0.05
MAX_MISSED_SET = 0.10
MIN_CAUGHT = 0.90
# A gold answer of a few words (a name, a date, a place) is looked for in the offline answer; a longer one is a
# reference explanation (gitdocs') that no answer repeats word for word.
GOLD_ANSWER_WORDS = 10


def answer_set_files(name: str, root: Path) -> tuple[Path, Path]:
    """(corpus file or folder, questions_dev.json) of a shared set by short name."""
    if name not in ANSWER_SETS:
        raise ValueError(f"unknown dataset {name!r} (expected one of {', '.join(ANSWER_SETS)} or all)")
    folder = root / ANSWER_SETS[name]
    corpus = folder / "src" if name == "gitdocs" else folder / "corpus.jsonl"
    questions = folder / "questions_dev.json"
    for f in (corpus, questions):
        if not f.exists():
            raise FileNotFoundError(f"dataset {name!r}: {f} does not exist")
    return corpus, questions


def run_answerable_bench(sets: dict[str, tuple[Path, Path, Path]], split: str = "all", settings: Settings | None = None,
                         progress: Callable[[str, int, int], None] | None = None) -> list[dict]:
    """One row per (index, question): `sets` maps a name to (corpus, questions file, index workdir); every
    set's questions of `split` are asked of every set's index (built once, reused). Rows carry the support
    score, whether the answer was marked answerable at the current threshold, and the answer a person reads."""
    from lazyhippo.query import answer_question, clear_cache

    asked = {name: select_split(json.loads(Path(q).read_text()), split) for name, (_, q, _) in sets.items()}
    rows: list[dict] = []
    for index_name, (corpus, _, workdir) in sets.items():
        indexed, _ = ensure_index(Path(corpus), Path(workdir), progress, settings)
        total, done = sum(map(len, asked.values())), 0
        for set_name, questions in asked.items():
            for q in questions:
                res = answer_question(indexed, q["question"], llm=None, reranker=None)
                own = set_name == index_name
                short = own and 0 < len(q.get("answer", "").split()) <= GOLD_ANSWER_WORDS
                golds = [q["answer"], *q.get("answer_aliases", [])] if short else []
                rows.append({"index": index_name, "set": set_name, "question": q["question"],
                             "half": split_of(q["question"]), "in_corpus": own,
                             "support": res.diagnostics["support"]["score"], "answerable": res.answerable,
                             "route": res.route, "answer": res.answer,
                             "holds_answer": holds_answer(res.answer, golds) if golds else None})
                done += 1
                if progress:
                    progress(f"questions on the {index_name} index", done, total)
        clear_cache()  # one index in memory at a time
    return rows


_WORDS = re.compile(r"\w+")
_CITATION = re.compile(r"\[\d+\]")


def _words(text: str) -> str:
    return " " + " ".join(_WORDS.findall(text.lower())) + " "


def holds_answer(answer: str, golds: Sequence[str]) -> bool:
    """Whether an answer's text holds one of the gold answers as a run of whole words, case, punctuation and
    citation numbers aside ("Timothy James McVeigh (April 23, 1968" holds "Timothy James McVeigh")."""
    text = _words(_CITATION.sub(" ", answer))
    return any(_words(g).strip() and _words(g) in text for g in golds)


def rates(rows: Sequence[dict], threshold: float) -> list[dict]:
    """Per set and half: answerable questions marked not answerable (`missed`) and out-of-corpus questions
    marked not answerable (`caught`, over the other sets' indexes), at `threshold`; of the answerable questions
    that carry a short gold answer, the share whose offline answer holds it (`holds_answer`), and the answers' mean
    length in characters (`answer_chars`): a short answer that still names what was asked."""
    out = []
    for name in dict.fromkeys(r["set"] for r in rows):
        for half in ("tune", "confirm"):
            own = [r for r in rows if r["set"] == name and r["half"] == half and r["in_corpus"]]
            other = [r for r in rows if r["set"] == name and r["half"] == half and not r["in_corpus"]]
            gold = [r for r in own if r.get("holds_answer") is not None]
            if own or other:
                out.append({"set": name, "half": half, "answerable": len(own), "out_of_corpus": len(other),
                            "missed": _share(own, lambda r: r["support"] < threshold),
                            "caught": _share(other, lambda r: r["support"] < threshold),
                            "holds_answer": _share(gold, lambda r: r["holds_answer"]) if gold else None,
                            "answer_chars": round(sum(len(r.get("answer", "")) for r in own) / len(own)) if own else None})
    return out


def _share(rows: Sequence[dict], test) -> float:
    return round(sum(map(test, rows)) / len(rows), 4) if rows else 0.0


def mean_rates(table: Sequence[dict], half: str) -> dict:
    """The sets' mean of `missed` and `caught` on one half (each set counts once, whatever its size)."""
    part = [r for r in table if r["half"] == half]
    return {k: round(sum(r[k] for r in part) / len(part), 4) if part else 0.0 for k in ("missed", "caught")}


def calibrate(rows: Sequence[dict], max_missed: float = MAX_MISSED, max_missed_set: float = MAX_MISSED_SET,
              min_caught: float = MIN_CAUGHT) -> tuple[float, float] | None:
    """The range of thresholds (the lowest and highest of the observed support scores) at which the tune halves
    meet every target, None when none does. Missed and caught both grow with the threshold, so the range is one
    interval: a default inside it is kept (moving it within trades one target's margin for the other's), one
    outside it moves to its middle."""
    tune = [r for r in rows if r["half"] == "tune"]
    met = []
    for t in sorted({r["support"] for r in tune} | {0.0}):
        table = rates(tune, t)
        mean = mean_rates(table, "tune")
        if (mean["missed"] <= max_missed and mean["caught"] >= min_caught
                and all(r["missed"] <= max_missed_set for r in table)):
            met.append(t)
    return (met[0], met[-1]) if met else None
