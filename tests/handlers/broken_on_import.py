"""A handler module whose import fails, as a typo in a real one would."""

raise ImportError("the pdf library is not installed")


def handle(job):  # pragma: no cover - never reached
    return None
