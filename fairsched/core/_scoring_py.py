"""Pure-Python twin of _scoring_c: score candidate jobs and order them."""

from array import array

from fairsched.core._checks import (
    as_free_counts,
    check_candidates,
    check_now,
    check_shares,
    check_weights,
)

_INF = float("inf")


def score_candidates(cands, now, free_counts, weights):
    """Return (scores array('d'), order array('q')) for the candidates at time `now`.

    order lists candidate indices by score descending, then eligible_at ascending (older
    first), then job id ascending, then index.
    """
    n = check_candidates(cands)
    now = check_now(now)
    free_counts = as_free_counts(free_counts)
    scores = score(cands, now, free_counts, check_weights(weights))
    return scores, order(cands, scores, n)


def tenant_floor(tenants, shares):
    """The lowest share among the candidates' tenants (0.0 when none has one): the tenant
    term is measured from it, so that with one tenant it is exactly 0 and the order is the
    order without tenants."""
    n_shares = len(shares)
    low = 2.0
    for k in tenants:
        if 0 <= k < n_shares and shares[k] < low:
            low = shares[k]
    return 0.0 if low > 1.0 else low


def score(cands, now, free_counts, weights):
    wp, wa, wr, wod, woda, wt = weights
    n_free = len(free_counts)
    shares = check_shares(cands.tenant_shares)
    n_shares = len(shares)
    low = tenant_floor(cands.tenants, shares)
    out = []
    append = out.append
    # The operations and their order match _scoring_c exactly so the doubles agree bit for bit.
    columns = zip(cands.types, cands.priorities, cands.eligible_at, cands.on_demand,
                  cands.tenants, strict=True)
    for t, p, e, od, k in columns:
        age = now - e
        if age < 0.0:
            age = 0.0
        s = p * wp + age * wa
        if 0 <= t < n_free:
            f = free_counts[t]
            if f > 0:
                s = s + wr / f
        if od:
            s = s + (wod + age * woda)
        if 0 <= k < n_shares:
            s = s - wt * (shares[k] - low)
        append(s)
    return array("d", out)


def order(cands, scores, n):
    # -score, with NaN (only reachable from absurd inputs) last, so the order is total.
    keys = [-s if s == s else _INF for s in scores]
    ranked = sorted(zip(keys, cands.eligible_at, cands.job_ids, range(n), strict=True))
    return array("q", [r[3] for r in ranked])
