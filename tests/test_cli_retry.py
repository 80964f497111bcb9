"""`fairsched retry` and `cancel` against real supervisors, driven through the command line."""

from __future__ import annotations

import json

import pytest

from tests.supervisor_harness import wait_until
from tests.test_cli_queue import WORKERS_TOML, fairsched, queue
from tests.test_queue_supervisors import SLOW

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


def test_retry_of_every_failed_job_of_a_type_runs_them_again(supervisors, db):
    # The dead-letter list once the cause is fixed: one command, one statement, however many.
    sup = supervisors(FAILING).start()
    jobs = [int(sup.cli("submit", "flaky").stdout) for _ in range(3)]
    for job_id in jobs:
        failed_for_good(sup, job_id)
    retried = sup.cli("retry", "--status", "failed", "--type", "flaky")
    assert (retried.returncode, retried.stderr) == (0, ""), retried.stderr
    assert retried.stdout == "3 failed jobs of type flaky pending again\n"
    for job_id in jobs:  # run again by the supervisor: a fresh budget of 2 attempts, spent
        wait_until(lambda job_id=job_id: (job := job_of(sup, job_id))["status"] == "failed"
                   and "(attempt 2)" in job["last_error"] and job["finished_at"] is not None
                   and job["run_after"] > job["created_at"], 30, f"job {job_id} to fail again")
    again = sup.cli("retry", "--status", "cancelled")
    assert (again.returncode, again.stdout) == (0, "no cancelled jobs to retry\n")


def test_retry_of_several_ids_names_each_one_it_cannot_retry(db, tmp_path):
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    first, second = cancelled_job(db, "pdf"), cancelled_job(db, "ocr")
    with queue(db) as q:
        pending = q.enqueue("pdf")
    result = fairsched("retry", str(first), str(pending), "999", str(second),
                       "--config", str(config), url=db)
    assert result.returncode == 1
    assert result.stdout == f"job {first} is pending again\njob {second} is pending again\n"
    assert result.stderr == (f"fairsched: job {pending} is pending; only failed or cancelled "
                             "jobs can be retried\nfairsched: no job with id 999\n")


def test_retry_of_every_failed_job_names_those_whose_key_another_job_holds(db, tmp_path):
    with queue(db) as q:
        kept = q.enqueue("pdf", key="invoice-17")
        assert q.cancel_job(kept) == "cancelled"
        q.enqueue("pdf", key="invoice-17")  # queued again meanwhile
    plain = cancelled_job(db, "pdf")
    result = fairsched("retry", "--status", "cancelled", url=db, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (1, "1 cancelled job pending again\n")
    assert result.stderr == (f"fairsched: 1 cancelled job left as it was: an unfinished job "
                             f"holds its idempotency key: {kept}\n")
    with queue(db) as q:
        assert [q.get_job(j)["status"] for j in (kept, plain)] == ["cancelled", "pending"]


@pytest.mark.parametrize("args, words", [
    ([], "give the IDs of the jobs to retry, or --status failed (or cancelled) for every job "
         "in that status"),
    (["--type", "pdf"], "give the IDs of the jobs to retry, or --status failed (or cancelled) "
                        "for every job in that status of that type"),
    (["3", "--status", "failed"], "give job IDs or --status (and --type), not both"),
    (["--status", "pending"], "--status must be failed or cancelled, got 'pending'"),
])
def test_retry_refuses_what_cannot_be_meant(db, tmp_path, args, words):
    result = fairsched("retry", *args, url=db, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"fairsched: {words}\n"


def test_cancel_of_every_running_and_pending_job_of_a_type(supervisors, db):
    # A batch queued by mistake: its backlog cancelled in one statement, and the jobs already
    # running stopped by their supervisor.
    sup = supervisors(SLOW + "slots = 2\n").start()
    jobs = [int(sup.cli("submit", "slow", "--payload", '{"seconds": 60}').stdout)
            for _ in range(5)]
    sup.wait_for(lambda ps: all(s["job_id"] is not None for s in ps["slots"]),
                 what="two jobs running")
    running = sorted(s["job_id"] for s in sup.slots())
    pending = sup.cli("cancel", "--status", "pending", "--type", "slow")
    assert (pending.returncode, pending.stderr) == (0, ""), pending.stderr
    assert pending.stdout == "3 pending jobs of type slow cancelled\n"
    stop = sup.cli("cancel", "--status", "running")
    assert (stop.returncode, stop.stdout) == (0, "2 running jobs: cancel requested\n")
    wait_until(lambda: all(job_of(sup, j)["status"] == "cancelled" for j in jobs), 20,
               "every job cancelled")
    for job_id in running:
        sup.wait_output(rf"job {job_id} cancelled: type slow")
    again = sup.cli("cancel", "--status", "pending")
    assert (again.returncode, again.stdout) == (0, "no pending jobs to cancel\n")


def test_cancel_of_several_ids_names_each_one_it_cannot_cancel(db, tmp_path):
    with queue(db) as q:
        first, second = q.enqueue("pdf"), q.enqueue("pdf")
    done = cancelled_job(db, "pdf")
    result = fairsched("cancel", str(first), str(done), str(second), url=db, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == f"job {first} cancelled\njob {second} cancelled\n"
    assert result.stderr == (f"fairsched: job {done} already cancelled; only unfinished jobs "
                             "can be cancelled\n")


@pytest.mark.parametrize("args, words", [
    ([], "give the IDs of the jobs to cancel, or --status pending (or running) for every job "
         "in that status"),
    (["--status", "failed"], "--status must be pending or running, got 'failed'"),
    (["3", "--type", "pdf"], "give job IDs or --status (and --type), not both"),
])
def test_cancel_refuses_what_cannot_be_meant(db, tmp_path, args, words):
    result = fairsched("cancel", *args, url=db, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"fairsched: {words}\n"


@pytest.mark.parametrize("command, status", [("retry", "failed"), ("cancel", "pending")])
def test_a_bulk_command_that_finds_nothing_of_a_type_no_group_runs_suggests_one(
        db, tmp_path, command, status):
    config = tmp_path / "workers.toml"
    config.write_text(WORKERS_TOML)
    result = fairsched(command, "--status", status, "--type", "pfd", "--config", str(config),
                       url=db)
    assert (result.returncode, result.stdout) == (0, f"no {status} jobs of type pfd to "
                                                     f"{command}\n")
    assert result.stderr == (f"no worker group in {config} runs type 'pfd' (configured types: "
                             "ocr, pdf); did you mean 'pdf'?\n")
