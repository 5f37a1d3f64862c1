"""Service credentials: from the environment, else from the file `scripts/services.sh` writes at install.

There is no default password anywhere in the code: `services.sh install` draws a random password per install
and records it in `<services dir>/credentials.env` (mode 0600, `KEY=value` lines). A variable set in the
environment wins over the file. Values are never logged or shown in a repr.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import REPO_ROOT


class MissingCredentials(RuntimeError):
    pass


def credentials_file() -> Path:
    """LAZYHIPPO_SERVICES_DIR/credentials.env (default <repo>/.services, as in scripts/services.sh)."""
    return Path(os.environ.get("LAZYHIPPO_SERVICES_DIR") or REPO_ROOT / ".services") / "credentials.env"


def _from_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    values = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.lstrip().startswith("#"):
            values[key.strip()] = value.strip()
    return values


def credential(*names: str, required: bool = True) -> str | None:
    """The first of `names` set in the environment, else in the services credentials file."""
    for name in names:
        if os.environ.get(name):
            return os.environ[name]
    path = credentials_file()
    stored = _from_file(path)
    for name in names:
        if stored.get(name):
            return stored[name]
    if required:
        raise MissingCredentials(f"{names[0]} is not set: export it, or run `bash scripts/services.sh install` "
                                 f"(writes a random one to {path})")
    return None
