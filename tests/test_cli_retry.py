"""`fairsched retry` and `cancel` against real supervisors, driven through the command line."""

from __future__ import annotations

import json

from tests.supervisor_harness import wait_until
from tests.test_cli_queue import WORKERS_TOML, fairsched, queue

FAILING = """
[[worker]]
name = "flaky"
types = ["flaky"]
handler = "sup_handlers:fail"
max_attempts = 2
retry_backoff = 0.05
"""


def job_of(sup, job_id: int) -> dict:
    result = sup.cli("jobs", "--json")
    assert result.returncode == 0, result.stderr
    return next(job for job in json.loads(result.stdout) if job["id"] == job_id)


def failed_for_good(sup, job_id: int) -> dict:
    return wait_until(lambda: (job := job_of(sup, job_id))["status"] == "failed" and job,
                      30, f"job {job_id} failed")


def test_retry_with_max_attempts_gives_the_job_a_new_budget(supervisors, db):
    sup = supervisors(FAILING).start()
    job_id = int(sup.cli("submit", "flaky").stdout)
    job = failed_for_good(sup, job_id)
    assert (job["attempts"], job["max_attempts"]) == (2, 2)

    bad = sup.cli("retry", str(job_id), "--max-attempts", "0")
    assert (bad.returncode, bad.stdout) == (2, ""), bad.stderr
    assert bad.stderr.strip() == ("fairsched: --max-attempts must be an integer from 1 to "
                                  "2147483647, got '0'")
    assert job_of(sup, job_id)["status"] == "failed"  # nothing written

    retried = sup.cli("retry", str(job_id), "--max-attempts", "4")
    assert (retried.returncode, retried.stdout) == (0, f"job {job_id} is pending again\n")
    job = failed_for_good(sup, job_id)
    assert (job["attempts"], job["max_attempts"]) == (4, 4)
    assert "failing on purpose (attempt 4)" in job["last_error"]

    # Without the option, the job keeps the budget it has.
    assert sup.cli("retry", str(job_id)).returncode == 0
    job = wait_until(lambda: (job := job_of(sup, job_id))["status"] == "failed"
                     and job["attempts"] == 4 and job, 30, "the second retry to fail")
    assert job["max_attempts"] == 4


def cancelled_job(db, type_name: str) -> int:
    with queue(db) as q:
        job_id = q.enqueue(type_name)
        assert q.cancel_job(job_id) == "cancelled"
    return job_id


def test_retry_of_a_type_no_group_runs_warns_and_retries_all_the_same(db, tmp_path):
    # A supervisor on another host, sharing the database, may run the type: the retry stands,
    # and the operator learns that no worker here will take it.
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    job_id = cancelled_job(db, "fax")
    result = fairsched("retry", str(job_id), "--config", str(config), url=db)
    assert (result.returncode, result.stdout) == (0, f"job {job_id} is pending again\n")
    assert result.stderr == (f"no worker group in {config} runs type 'fax' (configured types: "
                             f"ocr, pdf): job {job_id} waits for a supervisor whose "
                             "workers.toml does\n")
    with queue(db) as q:
        assert q.get_job(job_id)["status"] == "pending"


def test_retry_of_a_configured_type_or_on_a_host_without_workers_toml_is_silent(db, tmp_path):
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    job_id = cancelled_job(db, "ocr")
    result = fairsched("retry", str(job_id), "--config", str(config), url=db)
    assert (result.returncode, result.stderr) == (0, "")
    elsewhere = tmp_path / "web"  # a host that only queues work: no workers.toml
    elsewhere.mkdir()
    job_id = cancelled_job(db, "fax")
    result = fairsched("retry", str(job_id), url=db, cwd=elsewhere)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
