"""LLM tokens of answers and chat: the `token_usage` table of `<home>/usage.sqlite`.

Indexing records its tokens in the warehouse's `token_usage` table, inside the run that holds the warehouse.
Answers come from servers, chats and query runs that only read published snapshots and must never wait for an
index run's lock, so theirs go to a table of the same shape in a SQLite file of the home, which several
processes append to at once (WAL journal, a busy timeout). A failed write is logged and never fails an answer.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)
FILE = "usage.sqlite"
SCHEMA = """CREATE TABLE IF NOT EXISTS token_usage (
  namespace TEXT NOT NULL, run_id TEXT, stage TEXT NOT NULL, model TEXT, prompt_tokens INTEGER,
  completion_tokens INTEGER, recorded_at TEXT DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"""


def _open(home: Path) -> sqlite3.Connection:
    con = sqlite3.connect(Path(home) / FILE, timeout=10)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute(SCHEMA)
    return con


def record_answer_usage(home: Path, namespace: str, run_id: str | None, usage: list[dict]) -> int:
    """One row per operation and model of `usage` (an answer's `QueryResult.usage`); rows written."""
    if not usage:
        return 0
    try:
        con = _open(home)
        try:
            with con:
                con.executemany("INSERT INTO token_usage (namespace, run_id, stage, model, prompt_tokens, "
                                "completion_tokens) VALUES (?, ?, ?, ?, ?, ?)",
                                [(namespace, run_id, u["operation"], u["model"], u["prompt_tokens"],
                                  u["completion_tokens"]) for u in usage])
        finally:
            con.close()
    except (OSError, sqlite3.Error) as exc:
        log.warning("could not record the answer's token usage in %s: %s", Path(home) / FILE, exc)
        return 0
    return len(usage)


def answer_usage(home: Path, namespace: str | None = None, run_id: str | None = None) -> list[dict]:
    """Tokens recorded for answers, per namespace, operation and model (optionally of one namespace or run)."""
    if not (Path(home) / FILE).exists():
        return []
    con = _open(home)
    try:
        rows = con.execute("SELECT namespace, stage, model, count(*), sum(prompt_tokens), sum(completion_tokens) "
                           "FROM token_usage WHERE (?1 IS NULL OR namespace = ?1) AND (?2 IS NULL OR run_id = ?2) "
                           "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3", [namespace, run_id]).fetchall()
    finally:
        con.close()
    names = ("namespace", "operation", "model", "rows", "prompt_tokens", "completion_tokens")
    return [dict(zip(names, r)) for r in rows]
