"""What the actor reports as it works; a metrics exporter implements it (no-op by default)."""

from __future__ import annotations


class Observer:
    """Called on the actor's loop; implementations must be cheap and never raise."""

    def start(self, sup) -> None:
        pass

    def stop(self) -> None:
        pass

    def job_started(self, job_type: str, waited: float) -> None:
        pass

    def job_finished(self, job_type: str, outcome: str, seconds: float) -> None:
        """outcome: succeeded, failed (for good), retried, cancelled or returned (to the queue)."""

    def job_unrecorded(self, job_type: str, outcome: str) -> None:
        """A job_finished outcome (succeeded, failed or retried) the job table refused."""

    def worker_restarted(self, group: str) -> None:
        pass

    def group_scaled(self, group: str, processes: int, direction: str) -> None:
        """An autoscaled group grew ("up") or shrank ("down") to `processes`."""
    def worker_recycled(self, group: str, reason: str) -> None:
        """A process replaced for `reason`: max_jobs or max_rss (once its jobs are done), or
        rss_limit (killed at once)."""

    def claims_lost(self, count: int) -> None:
        pass

    def jobs_pruned(self, count: int) -> None:
        """Finished jobs deleted from the table (prune_after); called from the loop."""
