"""The SQL models run by DuckDB (plain `.sql` files), shipped as package data so a non-editable install finds them."""

from pathlib import Path

SQL_DIR = Path(__file__).resolve().parent
