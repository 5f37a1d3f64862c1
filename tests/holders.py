"""Another process holding the warehouse, for the concurrency tests: `python -m tests.holders MODE HOME NS`.

reader: keeps a read-only connection open. writer: holds the home's writer lock with the namespace's chunks
deleted in the work file (a run half-way). Both print "ready" and then sleep until killed or `seconds` pass."""

import sys
import time
from pathlib import Path

from lazyhippo.settings import Settings
from lazyhippo.stores.warehouse import WriterSession, connect

if __name__ == "__main__":
    mode, home, ns, seconds = sys.argv[1], Path(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    settings = Settings(home=home, namespace=ns)
    if mode == "reader":
        with connect(settings, read_only=True) as con:
            con.execute("SELECT count(*) FROM chunks").fetchone()
            print("ready", flush=True)
            time.sleep(seconds)
    else:
        with WriterSession(settings, "holder") as writer, writer.connect() as con:
            con.execute("DELETE FROM chunks WHERE namespace = ?", [ns])
            print("ready", flush=True)
            time.sleep(seconds)
