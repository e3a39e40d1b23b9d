"""The lease keeper: a small thread per server that renews the leases of the items this server runs, and sweeps the
queue for items whose lease ran out (their server stopped), as often as a third of the lease time."""

from __future__ import annotations

import logging
import threading

from invokeai.app.services.session_queue import SessionQueue

logger = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, queue: SessionQueue, period: float | None = None) -> None:
        """period: seconds between rounds; a third of the lease by default, so that two renewals may fail (a
        database hiccup, a long pause of the process) before another server takes the item for a stopped one's."""
        self._queue = queue
        self.period = queue.lease_seconds / 3 if period is None else period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="queue-lease-keeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def run_once(self) -> int:
        """Renew first: this server's own items are then never found expired by its own sweep. Returns how many
        items the sweep recovered."""
        self._queue.renew_leases()
        recovered = self._queue.recover_expired()
        if recovered:
            logger.warning(
                "Recovered %d queue item(s) whose server stopped while running them (%s)",
                recovered,
                "requeued" if self._queue.requeue_interrupted else "canceled",
            )
        return recovered

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.run_once()
            except Exception:
                # The database may be away for a moment; the next round tries again.
                logger.exception("Could not renew or sweep the queue's leases")
