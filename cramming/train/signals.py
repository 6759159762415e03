"""Preemption: SIGTERM, SIGINT and SIGUSR1 only set a flag; the trainer checkpoints at the next step boundary
and the run exits with EXIT_PREEMPTED, which a cluster scheduler can treat as "requeue me". A signal after the last
step lets the run finish (its final validation and checkpoint are the quickest way to a whole run) and exit 0."""

import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again later
SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")


class StopFlag:
    """A context manager that turns the signals into `self.signal` (the name of the first one received)."""

    def __init__(self):
        self.signal: str | None = None
        self.previous = {}
        self.then = "checkpointing at the end of this step"  # what the run does about it; the trainer moves it on

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            print(f"\n{self.signal} received: {self.then}", flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for name in SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        return False
