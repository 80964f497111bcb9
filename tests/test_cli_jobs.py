"""`fairsched jobs`, run as a real process against real PostgreSQL: what it lists, and what it
says about a listing that cannot be what was meant."""

from __future__ import annotations

import json
import re

import pytest

from fairsched.cli.common import display_width
from tests.supervisor_harness import wait_until
from tests.test_cli_queue import WORKERS_TOML, fairsched, queue


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "workers.toml"
    path.write_text(WORKERS_TOML)
    return path


@pytest.mark.parametrize("as_json", [False, True])
def test_jobs_of_a_type_no_group_runs_says_so_on_stderr(db, config, as_json):
    with queue(db) as q:
        q.enqueue("pdf")
    args = ["jobs", "--type", "pfd", "--config", str(config)] + (["--json"] if as_json else [])
    result = fairsched(*args, url=db)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ("[]\n" if as_json else
                             "ID  TYPE  PRI  STATUS  ATTEMPTS  AGE  LAST ERROR\n")
    assert result.stderr == (f"no worker group in {config} runs type 'pfd'"
                             " (configured types: ocr, pdf); did you mean 'pdf'?\n")


def test_jobs_of_a_type_no_group_runs_any_more_are_listed_without_a_word(db, config):
    with queue(db) as q:
        old = q.enqueue("fax")  # queued before the group that ran it went away
    result = fairsched("jobs", "--type", "fax", "--json", "--config", str(config), url=db)
    assert (result.returncode, result.stderr) == (0, "")
    assert [job["id"] for job in json.loads(result.stdout)] == [old]


def test_jobs_of_a_configured_type_with_none_queued_is_silent(db, config):
    result = fairsched("jobs", "--type", "ocr", "--config", str(config), url=db)
    assert (result.returncode, result.stderr) == (0, "")


def test_jobs_of_any_type_on_a_host_without_workers_toml_is_silent(db, tmp_path):
    result = fairsched("jobs", "--type", "anything", url=db, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")


def test_attempts_of_a_job_whose_max_attempts_is_unknown_here_are_explained(db, tmp_path):
    # On a host with only FAIRSCHED_DATABASE_URL, an unclaimed job reads '0/-': the '-' was
    # explained nowhere.
    with queue(db) as q:
        own = q.enqueue("pdf", max_attempts=4)
        unknown = q.enqueue("pdf")
    table = fairsched("jobs", url=db, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    attempts = {int(row.split()[0]): row.split()[4] for row in table.stdout.splitlines()[1:]}
    assert attempts == {own: "0/4", unknown: "0/-"}, table.stdout
    listed = json.loads(fairsched("jobs", "--json", url=db, cwd=tmp_path).stdout)
    assert {job["id"]: job["max_attempts"] for job in listed} == {own: 4, unknown: None}
    help_text = " ".join(fairsched("jobs", "--help", url=None).stdout.split())
    assert ("'-' where no workers.toml here names its type (this host has none, or none of "
            "its groups runs that type); --json gives null") in help_text, help_text


def test_jobs_with_a_status_that_does_not_exist_is_exit_2_naming_the_allowed_ones(db, config):
    result = fairsched("jobs", "--status", "done", "--config", str(config), url=db)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == ("fairsched: --status must be one of pending, running, succeeded,"
                             " failed, cancelled, got 'done'\n")


def test_a_job_with_a_number_too_long_for_python_is_listed_as_its_json_text(db, config):
    # 1e5000 written by hand comes back as 5001 digits, past what Python's int() reads: the
    # job fails when claimed, and must not take the dead-letter list down with it.
    with queue(db) as q:
        ok = q.enqueue("pdf", {"doc": 1})
        (odd,) = q.conn.execute(
            "INSERT INTO fairsched_jobs (type, payload, status, result, last_error)"
            " VALUES ('pdf', '{\"n\": 1e5000}', 'failed', '1e5000', 'too long') RETURNING id"
        ).fetchone()
    cli = ["--config", str(config)]
    listed = fairsched("jobs", "--json", *cli, url=db)
    assert (listed.returncode, listed.stderr) == (0, "")
    jobs = {job["id"]: job for job in json.loads(listed.stdout)}
    assert jobs[ok]["payload"] == {"doc": 1}
    assert jobs[odd]["payload"] == '{"n": 1' + "0" * 5000 + "}"
    assert jobs[odd]["result"] == "1" + "0" * 5000
    table = fairsched("jobs", "--status", "failed", *cli, url=db)
    assert (table.returncode, table.stderr) == (0, "")
    assert table.stdout.splitlines()[1].split()[:4] == [str(odd), "pdf", "0", "failed"]


def test_age_of_a_retried_job_counts_from_the_retry_not_from_its_submit(db, config):
    # AGE is how long the job has waited to run, as its score counts it: a job retried a week
    # after it was queued has waited since the retry.
    with queue(db) as q:
        job_id = q.enqueue("pdf")
        q.conn.execute("UPDATE fairsched_jobs SET created_at = now() - interval '7 days',"
                       " run_after = now() - interval '7 days' WHERE id = %s", (job_id,))
        assert q.cancel_job(job_id) == "cancelled"

    def age() -> str:
        result = fairsched("jobs", "--config", str(config), url=db)
        assert result.returncode == 0, result.stderr
        header, row = result.stdout.splitlines()
        return row[header.index("AGE"):].split()[0]

    assert age() == "7d00h"
    assert fairsched("retry", str(job_id), "--config", str(config), url=db).returncode == 0
    assert age() in ("0s", "1s", "2s", "3s")
    # When it was queued is still there for scripts.
    (job,) = json.loads(fairsched("jobs", "--json", "--config", str(config), url=db).stdout)
    assert job["run_after"] > job["created_at"], job


def test_a_listing_of_jobs_with_long_errors_takes_as_long_as_its_rows_not_their_errors(db, config):
    # A worker that fails with a whole document in its error (non-ASCII, so each character's
    # width is looked up): the table shows the two ends of its line, and must not read every
    # character of every error to do so, which took a minute for a few hundred jobs.
    with queue(db) as q:
        q.conn.execute(
            "INSERT INTO fairsched_jobs (type, status, attempts, max_attempts, last_error)"
            " SELECT 'pdf', 'failed', 4, 4, 'déjà vu ' || repeat('错误 x\x1b[31m', 15000)"
            "   FROM generate_series(1, 300)")
    result = fairsched("jobs", "--limit", "300", "--config", str(config), url=db, timeout=30)
    assert (result.returncode, result.stderr) == (0, "")
    rows = result.stdout.splitlines()[1:]
    assert len(rows) == 300
    error = rows[0][rows[0].index("déjà vu"):]
    assert error.startswith("déjà vu 错误 …") and error.endswith("错误 x\\x1b[31m"), error
    assert display_width(error) <= 60


def test_jobs_with_ids_shows_each_job_in_full_whatever_its_age(db, config):
    # The dead-letter list cuts an error at the edge of the terminal and shows the newest 100
    # jobs: `jobs ID` shows one job whole, however old, its error on as many lines as it has.
    with queue(db) as q:
        failed = q.enqueue("pdf", {"path": "a.pdf"}, priority=7, key="invoice-17")
        done = q.enqueue("ocr", {"path": "b.png"})
        q.conn.execute(
            "UPDATE fairsched_jobs SET status = 'failed', attempts = 3, max_attempts = 3,"
            " created_at = now() - interval '40 days', run_after = now() - interval '40 days',"
            " started_at = now() - interval '39 days', finished_at = now() - interval '39 days',"
            " claimed_by = 4, claims = 3,"
            " last_error = 'ValueError: page 3 is empty' || chr(10) || '  in render()'"
            " WHERE id = %s", (failed,))
        q.conn.execute(
            "UPDATE fairsched_jobs SET status = 'succeeded', attempts = 1, max_attempts = 3,"
            " started_at = now(), finished_at = now(), claimed_by = 4, claims = 1,"
            " result = '{\"pages\": 2, \"title\": \"Réunion\"}' WHERE id = %s", (done,))
        q.enqueue("pdf")  # newer, not asked for
    result = fairsched("jobs", str(done), str(failed), "--config", str(config), url=db)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    first, second = result.stdout.split("\n\n")
    fields = dict(line.split(None, 1) if not line.startswith(" ") else ("", line.strip())
                  for line in first.splitlines() if not line.startswith(("claimed", "last")))
    assert fields["job"] == str(done) and fields["type"] == "ocr"
    assert fields["status"] == "succeeded" and fields["attempts"] == "1 (max_attempts 3)"
    assert fields["payload"] == '{"path": "b.png"}'
    assert fields["result"] == '{"pages": 2, "title": "Réunion"}'
    assert "last error" not in first
    lines = second.splitlines()
    assert lines[:5] == [f"job         {failed}", "type        pdf",
                         "status      failed", "priority    7",
                         "attempts    3 (max_attempts 3)"], second
    assert re.fullmatch(r"created     \d{4}-\d\d-\d\d \d\d:\d\d:\d\d[+-]\d\d:\d\d "
                        r"\(40d00h ago\)", lines[5]), second
    assert lines[9:] == ["claimed by  supervisor 4 (claim 3)", "key         invoice-17",
                         'payload     {"path": "a.pdf"}',
                         "last error  ValueError: page 3 is empty",
                         "              in render()"], second


def test_jobs_with_ids_says_which_are_missing_and_shows_the_rest(db, config):
    with queue(db) as q:
        job = q.enqueue("pdf")
    result = fairsched("jobs", "999", str(job), "--config", str(config), url=db)
    assert result.returncode == 1
    assert result.stderr == "fairsched: no job with id 999\n"
    assert result.stdout.startswith(f"job         {job}\n"), result.stdout
    listed = fairsched("jobs", str(job), "999", "--json", "--config", str(config), url=db)
    assert listed.returncode == 1
    assert [row["id"] for row in json.loads(listed.stdout)] == [job]


@pytest.mark.parametrize("args, words", [
    (["1", "--status", "failed"], "give job IDs or --status, --type and --limit, not both"),
    (["1", "--limit", "5"], "give job IDs or --status, --type and --limit, not both"),
    (["x1"], "ID must be an integer"),
    (["od-4"], "od-4 is an on-demand job: it is in no table"),
])
def test_jobs_with_ids_refuses_what_cannot_be_meant(db, config, args, words):
    result = fairsched("jobs", *args, "--config", str(config), url=db)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("fairsched: ") and words in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_prune_deletes_what_finished_before_the_age_given_and_keeps_failed_jobs(db, config):
    with queue(db) as q:
        ids = {status: q.enqueue("pdf") for status in ("succeeded", "cancelled", "failed")}
        fresh = q.enqueue("pdf")
        q.conn.execute("UPDATE fairsched_jobs SET status = CASE id WHEN %s THEN 'succeeded'"
                       " WHEN %s THEN 'cancelled' ELSE 'failed' END,"
                       " finished_at = now() - interval '31 days' WHERE id <> %s",
                       (ids["succeeded"], ids["cancelled"], fresh))
    dry = fairsched("prune", "--older-than", "30d", "--dry-run", "--config", str(config), url=db)
    assert (dry.returncode, dry.stderr) == (0, ""), dry.stderr
    assert dry.stdout == ("2 succeeded or cancelled jobs finished more than 30d ago would be "
                          "deleted\n")
    done = fairsched("prune", "--older-than", "30d", "--config", str(config), url=db)
    assert done.stdout == "deleted 2 succeeded or cancelled jobs finished more than 30d ago\n"
    again = fairsched("prune", "--older-than", "30d", "--dry-run", "--config", str(config), url=db)
    assert again.stdout == ("no succeeded or cancelled jobs finished more than 30d ago would be "
                            "deleted\n")
    left = json.loads(fairsched("jobs", "--json", "--config", str(config), url=db).stdout)
    assert sorted(job["id"] for job in left) == [ids["failed"], fresh]
    failed = fairsched("prune", "--older-than", "720h", "--status", "failed", "--config",
                       str(config), url=db)
    assert failed.stdout == "deleted 1 failed job finished more than 720h ago\n"


def test_prune_says_an_age_of_0_as_any_age_and_a_bare_number_with_its_unit(db, config):
    # They were "finished more than 0 ago" and "finished more than 7200 ago".
    with queue(db) as q:
        done = q.enqueue("pdf")
        q.conn.execute("UPDATE fairsched_jobs SET status = 'succeeded', finished_at = now()"
                       " WHERE id = %s", (done,))
    bare = fairsched("prune", "--older-than", "7200", "--dry-run", "--config", str(config),
                     url=db)
    assert (bare.returncode, bare.stderr) == (0, ""), bare.stderr
    assert bare.stdout == ("no succeeded or cancelled jobs finished more than 2h ago would be "
                           "deleted\n")
    zero = fairsched("prune", "--older-than", "0", "--config", str(config), url=db)
    assert (zero.returncode, zero.stderr) == (0, ""), zero.stderr
    assert zero.stdout == "deleted 1 succeeded or cancelled job of any age\n"
    assert json.loads(fairsched("jobs", "--json", "--config", str(config), url=db).stdout) == []


@pytest.mark.parametrize("args, words", [
    (["--older-than", "1 month"], "--older-than must be an age such as 30d, 12h, 45m or 90s, "
                                  "got '1 month'"),
    (["--older-than", "30d", "--status", "pending"],
     "--status must be one of succeeded, failed, cancelled, got 'pending'"),
    ([], "Missing option '--older-than'"),
    (["--older-than", "99999999999d"], "--older-than must be at most 36500d, got '99999999999d'"),
])
def test_prune_refuses_what_cannot_be_meant(db, config, args, words):
    result = fairsched("prune", *args, "--config", str(config), url=db)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"fairsched: {words}"), result.stderr


def test_jobs_counts_shows_the_queue_by_type_configured_ones_included(db, config):
    with queue(db) as q:
        due = q.enqueue("pdf")
        q.conn.execute("UPDATE fairsched_jobs SET run_after = now() - interval '5 minutes'"
                       " WHERE id = %s", (due,))
        q.enqueue("pdf", delay=3600)
        for status in ("running", "failed", "failed", "succeeded"):
            job_id = q.enqueue("pdf")
            q.conn.execute("UPDATE fairsched_jobs SET status = %s WHERE id = %s",
                           (status, job_id))
        q.enqueue("fax")  # a type no group here runs: listed all the same
    table = fairsched("jobs", "--counts", "--config", str(config), url=db)
    assert (table.returncode, table.stderr) == (0, ""), table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split("  ")[0] == "TYPE" and header.endswith("OLDEST WAIT")
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    assert cells["ocr"] == ["0", "0", "0", "0", "-"]  # configured, nothing queued
    assert cells["pdf"][:4] == ["2", "1", "1", "2"] and cells["pdf"][4].startswith("5m")
    assert cells["fax"][:4] == ["1", "0", "0", "0"]
    assert list(cells) == ["fax", "ocr", "pdf"]
    (pdf,) = json.loads(fairsched("jobs", "--counts", "--type", "pdf", "--json", "--config",
                                  str(config), url=db).stdout)
    assert {k: v for k, v in pdf.items() if k != "oldest_wait"} == {
        "type": "pdf", "pending": 2, "delayed": 1, "running": 1, "failed": 2}
    assert 300 <= pdf["oldest_wait"] < 400
    refused = fairsched("jobs", "--counts", "--status", "failed", "--config", str(config),
                        url=db)
    assert (refused.returncode, refused.stdout) == (2, "")


def test_jobs_shows_why_a_long_error_failed_and_no_tries_to_come_for_a_job_failed_for_good(
        supervisors):
    # A handler's error names what it worked on first and why it failed last: cut at its
    # end, the reason was lost. And "1/3" on a job failed for good promised two more tries.
    sup = supervisors("""
[[worker]]
name = "pdf"
types = ["pdf"]
handler = "sup_handlers:fail_permanently"
max_attempts = 3
""").start()
    why = ("could not convert /srv/data/customers/2024/quarterly/reports/regional-summary-"
           "north-east.xlsx to PDF: the workbook is password-protected")
    job = sup.enqueue("pdf", payload={"why": why})
    wait_until(lambda: json.loads(sup.cli("jobs", str(job), "--json").stdout)[0]["status"]
               == "failed", what=f"job {job} failed")
    table = sup.cli("jobs")
    assert (table.returncode, table.stderr) == (0, "")
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "TYPE", "PRI", "STATUS", "ATTEMPTS", "AGE", "LAST", "ERROR"]
    assert row.split()[:5] == [str(job), "pdf", "0", "failed", "1"], row
    error = row[header.index("LAST ERROR"):]
    assert error == "PermanentError: …to PDF: the workbook is password-protected", row
    assert display_width(error) <= 60
    details = sup.cli("jobs", str(job)).stdout.splitlines()
    assert "attempts    1 (max_attempts 3)" in details, details
    assert f"last error  PermanentError: {why}" in details, details
