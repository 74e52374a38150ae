"""Paired differences shared by the experiment drivers: the mean over seeds, its 95% t-interval, and a two-one-sided
t-test (TOST) against a margin, so that "equal" is only said where the test says it."""
import statistics


def paired_difference(differences, margin=None):
    """``differences``: one value per seed (arm minus baseline, same seed). Returns ``{"mean", "low", "high", "tost_p"}``:
    ``low``/``high`` the 95% interval (None with one pair), ``tost_p`` the larger of the two one-sided p-values against
    +-``margin`` (H0: difference <= -margin, H0: difference >= +margin; equal within the margin when it is below 0.05,
    i.e. the 90% interval lies inside it), None without a margin or with one pair."""
    from scipy import stats

    mean, n = statistics.mean(differences), len(differences)
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "tost_p": None}
    se = statistics.stdev(differences) / n ** 0.5
    if se == 0:  # every seed gave the same difference: the interval is that point
        inside = margin is not None and abs(mean) < margin
        return {"mean": mean, "low": mean, "high": mean, "tost_p": None if margin is None else (0.0 if inside else 1.0)}
    low, high = stats.t.interval(0.95, n - 1, loc=mean, scale=se)
    tost_p = None
    if margin is not None:
        p_low = stats.t.sf((mean + margin) / se, n - 1)
        p_high = stats.t.cdf((mean - margin) / se, n - 1)
        tost_p = float(max(p_low, p_high))
    return {"mean": mean, "low": float(low), "high": float(high), "tost_p": tost_p}


def interval_text(paired):
    """A table cell for ``paired_difference``'s 95% interval: "low to high", or "– (one pair)"."""
    return "– (one pair)" if paired["low"] is None else f"{paired['low']:+.2f} to {paired['high']:+.2f}"
