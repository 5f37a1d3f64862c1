"""What a process prints on stderr besides its progress and results: warnings and errors, and with `verbose`
(`lazyhippo --verbose`, LAZYHIPPO_VERBOSE=1) the libraries' info and debug records too."""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator


def configure_logging(verbose: bool) -> None:
    """One stderr handler on the root logger whose level is the verbosity: libraries that set their own loggers
    to DEBUG (bm25s does on import) still reach it, and are dropped there."""
    level = logging.DEBUG if verbose else logging.WARNING
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


@contextmanager
def without_records_from(package: str, verbose: bool) -> Iterator[None]:
    """Drop the root logger's records logged from inside `package` (a module path prefix) while the block runs,
    unless `verbose`: for libraries that log advice to the root logger instead of a logger of their own."""
    def keep(record: logging.LogRecord) -> bool:
        return not record.pathname.replace("\\", "/").split("site-packages/")[-1].startswith(package)

    root = logging.getLogger()
    if not verbose:
        root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)
