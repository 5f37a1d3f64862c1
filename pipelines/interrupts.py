"""A process started in the background (`nohup lazyhippo index &`, `nohup dagster dev &`) inherits SIGINT
ignored, and Dagster maps SIGTERM to SIGINT's handler when a run starts in a main thread: SIGTERM is then
ignored too, by every process the run starts, and Dagster's compute-log `tail`s each hold their step until a
30 s timeout. Ctrl-C cannot reach a background process anyway, so Python's default handler comes back."""

import signal
import threading


def restore_interrupts() -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
