"""The web dashboard: one page and the JSON API it reads, served on the supervisor's loop
(app.py); aiohttp is imported only by a supervisor that serves it."""

from fairsched.errors import FairschedError


class WebError(FairschedError):
    """The dashboard cannot start: its address is taken, or its token cannot be had."""
