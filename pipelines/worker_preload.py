"""Preloaded by the forkserver of `lazyhippo index --workers N` (runner.execute_parallel): the offline
extractor's spaCy model is loaded once there, so every step process forked from it starts with the model in
memory instead of loading its own (seconds per extraction batch)."""

from lazyhippo.settings import Settings
from lazyhippo.stages.extractions import make_extractor

_settings = Settings.from_env()
if _settings.extractor == "nlp":
    make_extractor(_settings).extract([])  # loads and caches the model (lazyhippo.models.extractors._spacy)
