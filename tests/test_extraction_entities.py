"""What offline extraction makes an entity: a bare month, weekday or title word is none; a full date, a named
title and a document's own title are. A fact is a whole sentence."""

from lazyhippo.models.extractors import NlpExtractor, extraction_from_json
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
