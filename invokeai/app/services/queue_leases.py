"""The lease keeper: a small thread per server that ends the items its workers dropped, renews the leases of the
items this server runs, and sweeps the queue for items whose lease ran out (their server stopped), as often as a
third of the lease time. It knows when it could not reach the database, and after such an outage it waits one lease
before sweeping, so that the other servers, cut off as long, renew their leases first."""

from __future__ import annotations

import logging
import threading
import time

from invokeai.app.services.database_retry import DATABASE_ERRORS
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
        # Whether the last round could not reach the database, and (monotonic) when sweeping may start again.
        self.cut_off = False
        self._sweep_from = 0.0

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
        """End this server's dropped items, renew its running ones, then sweep: its own items are then never found
        expired by its own sweep. Returns how many items the sweep recovered. Raises the database's error when it
        cannot be reached (and remembers that)."""
        try:
            self._queue.end_dropped()
            self._queue.renew_leases()
        except DATABASE_ERRORS:
            self.cut_off = True
            raise
        if self.cut_off:
            # Every other server lost the database as long as this one: their leases ran out meanwhile, but they
            # are alive and renew within a third of a lease of reaching it again. Sweeping now would cancel them.
            self.cut_off = False
            self._sweep_from = time.monotonic() + self._queue.lease_seconds
            logger.warning(
                "The queue's database answers again; leases are renewed, and expired ones swept from %.0f s on",
                self._queue.lease_seconds,
            )
        if time.monotonic() < self._sweep_from:
            return 0
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
            was_cut_off = self.cut_off
            try:
                self.run_once()
            except DATABASE_ERRORS as error:
                if not was_cut_off:  # one line per outage, not one per round
                    logger.warning(
                        "The queue's database cannot be reached (%s: %s); leases are not renewed until it answers",
                        type(error).__name__,
                        " ".join(str(error).split()),
                    )
            except Exception:
                logger.exception("Could not renew or sweep the queue's leases")
