"""The local route's final order: the graph's fused by rank with BM25's, each document's best chunk first. On a
question whose named thing leads the graph to the wrong document while its words lead BM25 to the right one, the
default route keeps the right document at least where BM25 has it."""

from __future__ import annotations

import numpy as np
import pytest

from lazyhippo.evaluate.bench import all_supporting_at_k, recall_at_k
from lazyhippo.index import run_index
from lazyhippo.query import DEFAULT_CONFIG, retrieve
from lazyhippo.query.local import documents_first, fuse_ranks
from lazyhippo.query.loader import load_index
from lazyhippo.settings import Settings

GRAPH_ONLY = DEFAULT_CONFIG.with_(local={"lexical_weight": 0.0, "chunks_per_document": 0})
QUESTION = "Which todo commands does the Halden Telescope accept when squashing: fixup, reword or exec?"


@pytest.fixture(scope="module")
def manual(tmp_path_factory) -> Settings:
    """A long page all about the Halden Telescope (the name the question gives), a short page that holds the
    answer's words but names nothing, and filler pages."""
    src = tmp_path_factory.mktemp("manual_src")
    halden = [f"The Halden Telescope at the Marlow Observatory was rebuilt by Ada Fenwick in {1900 + i}. "
              f"Ada Fenwick and Tomas Reyes measured the Halden Telescope mirror, part {i}, with the Marlow Observatory "
              "staff, and the Halden Telescope dome was painted again." for i in range(40)]
    (src / "halden_telescope.txt").write_text("\n\n".join(halden) + "\n")
    (src / "todo_list.txt").write_text(
        "The interactive todo list accepts the commands pick, reword, edit, squash, fixup and exec. A fixup line "
        "folds its commit into the one above and drops its message; reword stops to edit the message; exec runs a "
        "shell command after the line above it. Squashing keeps both messages.\n")
    for i in range(6):
        (src / f"page_{i}.txt").write_text(f"Page {i} explains option number {i} of the tool, its default value and "
                                           f"where the setting is stored in the configuration file number {i}.\n")
    settings = Settings(home=tmp_path_factory.mktemp("manual_home"), source=str(src))
    run_index(settings)
    return settings


def _files(settings: Settings, config=None, top_k: int = 8) -> list[str]:
    return [c.source for c in retrieve(settings, QUESTION, route="local", top_k=top_k, config=config, reranker=None)]


def _bm25_files(settings: Settings, top_k: int = 8) -> list[str]:
    from lazyhippo.models.embedders import get_embedder
    from lazyhippo.query.nearest import top_indices
    from lazyhippo.query.types import PreparedQuery

    idx = load_index(settings)
    scores = PreparedQuery(idx, QUESTION, get_embedder(settings.embedder, settings.embedding_model)).bm25
    return [idx.chunks.sources[c] for c in top_indices(scores, top_k) if scores[c] > 0]


def test_fused_ranking_is_never_below_bm25_where_the_graph_misses(manual):
    gold = ["todo_list.txt"]
    graph, bm25, fused = _files(manual, GRAPH_ONLY), _bm25_files(manual), _files(manual)
    assert recall_at_k(bm25, gold, 1) == 1.0                        # BM25 finds the page by its words
    assert recall_at_k(graph, gold, 1) == 0.0                       # the graph follows the name elsewhere
    assert all(f == "halden_telescope.txt" for f in graph[:4])      # ... and fills its top with that one page
    for k in (2, 5, 8):  # the graph's first place leads, BM25's first follows it
        assert recall_at_k(fused, gold, k) >= recall_at_k(bm25, gold, k), k
    assert fused[:2] == ["halden_telescope.txt", "todo_list.txt"]
    assert len(set(fused)) == len(fused)  # one chunk per page first: every page before any page's second chunk


def test_fuse_ranks_and_documents_first_on_hand_made_orders():
    order, scores = fuse_ranks([np.array([5, 6, 7]), np.array([7, 8])], [1.0, 0.5])
    assert order.tolist() == [5, 7, 6, 8]   # 7: 1/3 + 0.5/1 over 6's 1/2; 5 (1/1) leads; 8 (0.5/2) last
    assert np.all(np.diff(scores) <= 0) and scores[1] == pytest.approx(1 / 3 + 0.5)

    class Chunks:
        doc_ids = ["a", "a", "a", "b", "c"]

    class Idx:
        chunks = Chunks()

    assert documents_first(Idx(), np.array([0, 1, 3, 2, 4]), 1, 5).tolist() == [0, 3, 4, 1, 2]
    assert documents_first(Idx(), np.array([0, 1, 3, 2, 4]), 1, 2).tolist() == [0, 3]
    assert documents_first(Idx(), np.array([0, 1, 3, 2, 4]), 2, 5).tolist() == [0, 1, 3, 4, 2]
    assert documents_first(Idx(), np.array([0, 1, 3, 2, 4]), 0, 4).tolist() == [0, 1, 3, 2]
