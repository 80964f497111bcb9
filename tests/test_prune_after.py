"""[supervisor] prune_after: a running supervisor deletes old succeeded and cancelled jobs."""

import json
import re

from tests.supervisor_harness import wait_until
from tests.test_metrics import free_port, scrape, value

WORKERS = """
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:echo"

[[worker]]
name = "bad"
types = ["bad"]
handler = "sup_handlers:fail_permanently"
"""

AGE = 5  # seconds: prune_after, so a supervisor looks for old jobs every 1.25 s


def jobs(sup, *args) -> dict:
    result = sup.cli("jobs", "--json", *args)
    # The IDs asked for are those of jobs younger than prune_after: all still there.
    assert result.returncode == 0, result.stderr
    return {row["id"]: row["status"] for row in json.loads(result.stdout)}


def pruned_in_log(sup) -> int:
    found = re.findall(rf"pruned (\d+) succeeded or cancelled jobs? that finished more than "
                       rf"{AGE}s ago \(prune_after\)", sup.output())
    return sum(int(n) for n in found)


def test_old_succeeded_and_cancelled_jobs_go_failed_ones_stay(supervisors):
    port = free_port()
    sup = supervisors(WORKERS, supervisor=f'prune_after = "{AGE}s"\n'
                                          f'metrics = "127.0.0.1:{port}"').start()
    done = [sup.enqueue("pdf", payload={"n": n}) for n in range(3)]
    failed = sup.enqueue("bad")
    later = sup.enqueue("pdf", "--delay", "3600")
    assert sup.cli("cancel", str(later)).returncode == 0
    def finished():
        # Under load the first jobs can end, and be pruned AGE later, before this first looks:
        # one of them gone has succeeded (none was cancelled, and a failed one would stay).
        # The whole listing, not these ids: asked for by id, one gone would be an error.
        found = jobs(sup)
        return found.get(failed) == "failed" and all(
            found.get(job, "succeeded") == "succeeded" for job in done)

    wait_until(finished, what="the jobs to finish")

    # Kept while younger than prune_after: a job that just finished is still there.
    fresh = sup.enqueue("pdf")
    wait_until(lambda: jobs(sup).get(fresh) == "succeeded", what="the fresh job")
    gone = set(done) | {later}
    wait_until(lambda: not gone & jobs(sup).keys(), timeout=4 * AGE, what="the old jobs pruned")
    left = jobs(sup)
    assert left.get(failed) == "failed"  # the dead-letter list stays

    wait_until(lambda: pruned_in_log(sup) >= 4, what="the log lines")
    wait_until(lambda: fresh not in jobs(sup), timeout=4 * AGE, what="the fresh job pruned too")
    wait_until(lambda: pruned_in_log(sup) == 5, what="its log line")
    assert value(scrape(port), "fairsched_jobs_pruned_total") == 5
    assert jobs(sup) == {failed: "failed"}
