"""The SQL of the supervisor's side of the job table (aqueue.py runs it): fetch, claim,
outcomes, hand-backs, rescue. Each statement is shaped for the index it must use, whatever the
planner's statistics say at the time; the reasons are written beside them.
"""

from fairsched.store.schema import MAX_PRIORITY

# Property 2 of the design: per type, the k best jobs by score. For queued jobs of one tenant
# the score order is the ascending order of (eligible_epoch - priority * W_p / W_a); within one
# priority level that is run_after order, so a tenant's k best are among the k oldest of each of
# the eleven levels, and each level is one short range scan of the partial index. The tenant
# term is the same for every job of a tenant, so the k best of the type overall are among the
# k best of each tenant with pending jobs of it: those tenants are walked through the index
# (a loose index scan, one probe each), and each one's k best read. With one tenant this is
# the k best of the type, as it was before tenants. Only what scoring needs is read, all of it
# in that index but the tenant's usage (one row per tenant), decayed to now: the payload of the
# jobs won comes back with the claim.
FETCH_SQL = f"""
SELECT c.id, c.type, c.priority, c.eligible_at, c.tenant,
       coalesce(u.usage * power(2::float8, greatest(
           -extract(epoch FROM now() - u.updated_at)::float8 / %(half_life)s::float8,
           -1000::float8)), 0)
  FROM unnest(%(types)s::text[], %(limits)s::integer[]) AS want(type, k)
 CROSS JOIN LATERAL (
       WITH RECURSIVE tenants(name) AS (
           (SELECT coalesce(tenant, '') FROM fairsched_jobs
             WHERE status = 'pending' AND type = want.type
             ORDER BY coalesce(tenant, '') LIMIT 1)
           UNION ALL
           SELECT (SELECT coalesce(f.tenant, '') FROM fairsched_jobs AS f
                    WHERE f.status = 'pending' AND f.type = want.type
                      AND coalesce(f.tenant, '') > tenants.name
                    ORDER BY coalesce(f.tenant, '') LIMIT 1)
             FROM tenants WHERE tenants.name IS NOT NULL)
       SELECT best.*, tenants.name
         FROM tenants
        CROSS JOIN LATERAL (
              SELECT j.id, j.type, j.priority,
                     extract(epoch FROM j.run_after)::float8 AS eligible_at, j.tenant
                FROM generate_series(0, {MAX_PRIORITY}) AS level(priority)
               CROSS JOIN LATERAL (
                     SELECT id, type, priority, run_after, tenant
                       FROM fairsched_jobs
                      WHERE status = 'pending' AND type = want.type
                        AND coalesce(tenant, '') = tenants.name
                        AND priority = level.priority AND run_after <= now()
                      ORDER BY run_after, id
                      LIMIT want.k) AS j
               ORDER BY extract(epoch FROM j.run_after)::float8 - j.priority * %(pps)s::float8,
                        j.id
               LIMIT want.k) AS best
        WHERE tenants.name IS NOT NULL) AS c
  LEFT JOIN fairsched_tenant_usage AS u ON u.tenant = c.name
 ORDER BY c.eligible_at - c.priority * %(pps)s::float8, c.id
"""

# Autoscaling: how many jobs of each type have been eligible for at least %(wait)s seconds and
# still wait, counted up to a cap per type (all the autoscaler needs to know is whether the
# backlog outgrows the processes starting). Each count is a range scan of the fetch's partial
# index on (type, ...) that stops at the cap, however long the queue.
BACKLOG_SQL = """
SELECT want.type, (SELECT count(*) FROM (
       SELECT 1 FROM fairsched_jobs
        WHERE status = 'pending' AND type = want.type
          AND run_after <= now() - make_interval(secs => %(wait)s::float8)
        LIMIT want.k) AS waiting)
  FROM unnest(%(types)s::text[], %(caps)s::integer[]) AS want(type, k)
"""

# Claims and outcomes name their rows by id, and must find them through the primary key. A
# plain `status = 'pending'` (or 'running') would let the planner pick a partial index by its
# predicate and walk every entry in it, dead ones included; with statistics taken while the
# queue looked different (all pending, nothing running), it does, and a 1 ms statement takes
# 10 ms. The status to match comes from a subquery the planner cannot see into (OFFSET 0), so
# the condition proves no index predicate and the primary key is the only way in.
#
# Outcomes join nothing. Those same statistics say no row has claimed_by set, so the planner
# believes `claimed_by = me` leaves one row and puts the table on the outer side of a nested
# loop over the batch: rows x batch comparisons, over a second for 512 outcomes. Instead the
# rows come from `id = ANY(ids)` through the primary key, and each one's claim (and result)
# is looked up in a jsonb object keyed by job id: linear in the batch whatever the estimates.
# The claim joins nothing either: the rows it locked come back as an array (an InitPlan, run
# once) that the update looks up through the primary key. Joined to them instead, the generic
# plan a prepared claim settles on after a few executions guesses ten rows a side and compares
# every row of the batch with every other, a million comparisons and 100 ms for 1,024 jobs.
def _fence(status: str) -> str:
    return f"(SELECT '{status}'::text OFFSET 0) AS fence(status)"


# SKIP LOCKED: a row another supervisor is claiming right now is a lost claim, not a wait.
CLAIM_SQL = f"""
UPDATE fairsched_jobs AS j
   SET status = 'running', attempts = j.attempts + 1, claims = j.claims + 1, claimed_by = %(me)s,
       started_at = now(), finished_at = NULL, cancel_requested = false,
       max_attempts = coalesce(j.max_attempts, (%(defaults)s::jsonb ->> j.type)::integer,
                               %(fallback)s)
 WHERE j.id = ANY(ARRAY(
       SELECT p.id FROM fairsched_jobs AS p, {_fence("pending")}
        WHERE p.id = ANY(%(ids)s::bigint[]) AND p.status = fence.status
          AND p.run_after <= now()
        ORDER BY p.id FOR UPDATE OF p SKIP LOCKED))
RETURNING j.id, j.type, j.priority, extract(epoch FROM j.run_after)::float8,
          j.payload::text, j.attempts, j.max_attempts, j.claims
"""

def _used(source: str) -> str:
    """The CTE that adds the slot-seconds of the jobs in `source` (its tenant and seconds
    columns) to their tenants' usage rows, decayed first (see COMPLETE_SQL)."""
    return f"""used AS (
    INSERT INTO fairsched_tenant_usage AS u (tenant, usage, updated_at)
    SELECT tenant, sum(seconds), now() FROM {source} GROUP BY tenant ORDER BY tenant
    ON CONFLICT (tenant) DO UPDATE
       SET usage = u.usage * power(2::float8, greatest(
               -greatest(extract(epoch FROM now() - u.updated_at)::float8, 0)
               / %(half_life)s::float8, -1000::float8)) + excluded.usage,
           updated_at = greatest(now(), u.updated_at)
)"""


# The slot-seconds the jobs took are added to their tenants' usage (the default tenant's row
# is ''), decayed first by the time since it was last written: every supervisor sharing the
# database reads the same figures. The tenants' rows are written in name order, so two
# batches that share tenants wait for each other rather than deadlock.
COMPLETE_SQL = f"""
WITH done AS (
    UPDATE fairsched_jobs AS j
       SET status = 'succeeded', result = nullif(%(done)s::jsonb -> j.id::text -> 1, 'null'),
           finished_at = now(), cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = fence.status AND j.claimed_by = %(me)s
       AND j.claims = (%(done)s::jsonb -> j.id::text ->> 0)::integer
    RETURNING j.id, j.type, coalesce(j.tenant, '') AS tenant,
              greatest(extract(epoch FROM now() - j.started_at)::float8, 0) AS seconds
), notified AS (
    -- [limits]: a place is free; the supervisors waiting for one look again.
    SELECT pg_notify('fairsched_jobs', t.type)
      FROM (SELECT DISTINCT type FROM done WHERE type = ANY(%(limited)s::text[])) AS t
), {_used("done")}
SELECT id FROM done WHERE (SELECT count(*) FROM notified) >= 0
"""

# job.transaction()'s, in the worker, in the same transaction as the handler's writes: the job
# succeeded, if its claim still holds. Another claim (a rescue after a lost lease, then a run
# elsewhere) has its own number, and a row given back or rescued is no longer 'running': either
# way no row changes, and the worker rolls back. The worker knows no supervisor id: the claim
# number alone names this run. The result stays null (the handler has not returned yet).
WORKER_COMPLETE_SQL = """
UPDATE fairsched_jobs SET status = 'succeeded', result = NULL, finished_at = now(),
       cancel_requested = false
 WHERE id = %s AND claims = %s AND status = 'running'
RETURNING id
"""

# A failure after a cancel request ends the job cancelled: the user asked for it to stop.
# The attempt's slot-seconds count toward its tenant's usage as a success's do (`was`: the
# row as the statement's snapshot has it, its started_at, which a retry clears): a tenant
# whose jobs fail takes its slots all the same.
FAIL_SQL = f"""
WITH failed AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN cancel_requested THEN 'cancelled'
                      WHEN %(permanent)s OR attempts >= max_attempts THEN 'failed'
                      ELSE 'pending' END,
        last_error = %(error)s,
        run_after = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                         THEN run_after
                         ELSE now() + %(delay)s * interval '1 second' END,
        finished_at = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                           THEN now() END,
        started_at = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                          THEN started_at END,
        claimed_by = CASE WHEN cancel_requested OR %(permanent)s OR attempts >= max_attempts
                          THEN claimed_by END,
        cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = %(id)s AND j.status = fence.status
       AND j.claimed_by = %(me)s AND j.claims = %(claim)s
    RETURNING j.type, j.status, coalesce(j.tenant, '') AS tenant,
              greatest(extract(epoch FROM now() - (
                  SELECT was.started_at FROM fairsched_jobs AS was WHERE was.id = j.id)
              )::float8, 0) AS seconds
), {_used("failed")}
SELECT status, CASE WHEN status = 'pending' THEN pg_notify('fairsched_jobs', type) END
  FROM failed
"""

CANCEL_FINISH_SQL = f"""
WITH cancelled AS (
    UPDATE fairsched_jobs AS j
       SET status = 'cancelled', finished_at = now(), cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = %(id)s AND j.status = fence.status
       AND j.claimed_by = %(me)s AND j.claims = %(claim)s
    RETURNING j.status, coalesce(j.tenant, '') AS tenant,
              greatest(extract(epoch FROM now() - j.started_at)::float8, 0) AS seconds
), {_used("cancelled")}
SELECT status FROM cancelled
"""

# Back to pending without spending the attempt, keeping run_after so the job keeps its age.
RELEASE_SQL = f"""
WITH released AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN j.cancel_requested THEN 'cancelled' ELSE 'pending' END,
        attempts = j.attempts - 1, started_at = NULL,
        finished_at = CASE WHEN j.cancel_requested THEN now() END,
        claimed_by = CASE WHEN j.cancel_requested THEN j.claimed_by END,
        cancel_requested = false
      FROM {_fence("running")}
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.status = fence.status AND j.claimed_by = %(me)s
       AND j.claims = (%(claims)s::jsonb ->> j.id::text)::integer
    RETURNING j.id, j.type, j.status)
SELECT id, status, CASE WHEN status = 'pending' THEN pg_notify('fairsched_jobs', type) END
  FROM released
"""

# The running jobs of the supervisors just found dead, and orphans: running jobs whose
# supervisor row is gone for another reason (deleted by hand). An orphan must be older than
# ORPHAN_AGE, because a supervisor registered after this statement's snapshot may own it.
RESCUE_SQL = """
WITH rescued AS (
    UPDATE fairsched_jobs AS j SET
        status = CASE WHEN j.cancel_requested THEN 'cancelled'
                      WHEN j.attempts >= j.max_attempts THEN 'failed'
                      ELSE 'pending' END,
        last_error = CASE WHEN j.cancel_requested THEN j.last_error
                          ELSE 'supervisor ' || j.claimed_by || ' stopped heartbeating during'
                               || ' attempt ' || j.attempts || ' of ' || j.max_attempts END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                           THEN now() END,
        started_at = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                          THEN j.started_at END,
        claimed_by = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                          THEN j.claimed_by END,
        run_after = CASE WHEN j.cancel_requested OR j.attempts >= j.max_attempts
                         THEN j.run_after ELSE now() END,
        cancel_requested = false
     WHERE j.status = 'running'
       AND (j.claimed_by = ANY(%(dead)s::bigint[])
            OR (j.claimed_by IS DISTINCT FROM %(me)s
                AND j.started_at < now() - %(orphan_age)s * interval '1 second'
                AND NOT EXISTS (SELECT 1 FROM fairsched_supervisors s
                                 WHERE s.id = j.claimed_by)))
    RETURNING j.type, j.status
), notified AS (
    SELECT pg_notify('fairsched_jobs', type)
      FROM (SELECT DISTINCT type FROM rescued WHERE status = 'pending') AS t
)
SELECT status, count(*), (SELECT count(*) FROM notified) FROM rescued GROUP BY status
"""
ORPHAN_AGE = 60.0

# Seconds until the earliest future run_after, by the server's clock: one index probe per
# (type, priority), the pending types walked through the index too (a loose index scan).
NEXT_ELIGIBLE_SQL = f"""
WITH RECURSIVE pending_types(type) AS (
    (SELECT type FROM fairsched_jobs WHERE status = 'pending' ORDER BY type LIMIT 1)
    UNION ALL
    SELECT (SELECT f.type FROM fairsched_jobs f
             WHERE f.status = 'pending' AND f.type > t.type ORDER BY f.type LIMIT 1)
      FROM pending_types t WHERE t.type IS NOT NULL
)
SELECT extract(epoch FROM min(next.run_after) - now())::float8
  FROM pending_types
 CROSS JOIN generate_series(0, {MAX_PRIORITY}) AS level(priority)
 CROSS JOIN LATERAL (
       SELECT run_after FROM fairsched_jobs
        WHERE status = 'pending' AND type = pending_types.type AND priority = level.priority
          AND run_after > now()
        ORDER BY run_after LIMIT 1) AS next
 WHERE pending_types.type IS NOT NULL
"""

# [limits]: a claim that holds a job of a limited type counts that type's running jobs (and
# the on-demand jobs holding a place in fairsched_limit_holds) under one transaction-level
# advisory lock, in a statement that starts after the lock is taken: under READ COMMITTED it
# sees every claim committed by a claimer that held the lock before, and no claimer can commit
# a claim of a limited type between that count and this claim's commit. So the jobs running
# never outnumber the limit, however many supervisors claim at once. Batches with no job of a
# limited type take no lock.
LIMIT_LOCK = 0x666169726C696D74  # the bytes of "fairlimt"

# The jobs of limited types in a claim's batch, and whether each is pending. Read before the
# lock, so one that is not pending now is left out of the claim (a lost claim, as without
# limits): were it put back to pending by then (a rescue, a shutdown), the claim would take it
# uncounted and the limit could be exceeded.
LIMITED_IN_BATCH_SQL = """
SELECT id, type, status = 'pending' FROM fairsched_jobs
 WHERE id = ANY(%(ids)s::bigint[]) AND type = ANY(%(limited)s::text[])
"""

LIMIT_RUNNING_SQL = """
SELECT want.type,
       (SELECT count(*) FROM fairsched_jobs AS j WHERE j.status = 'running' AND j.type = want.type)
       + (SELECT count(*) FROM fairsched_limit_holds AS h WHERE h.type = want.type)
  FROM unnest(%(types)s::text[]) AS want(type)
"""

RELEASE_HOLDS_SQL = """
WITH gone AS (
    DELETE FROM fairsched_limit_holds WHERE id = ANY(%(ids)s::bigint[]) RETURNING type
)
SELECT pg_notify('fairsched_jobs', t.type) FROM (SELECT DISTINCT type FROM gone) AS t
"""
