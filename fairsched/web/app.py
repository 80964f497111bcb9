"""The web dashboard ([supervisor] web): one page, its static files and the JSON API it reads,
served by aiohttp on the actor's own loop.

What it may cost the actor is bounded: the slots are copied once a second (status.snapshot,
as `ps` has them) into ONE frame that every page following them is sent, and only while one
does; the process figures are read and the frame encoded in a thread; the job table is read
and changed on the dashboard's own connection, in a thread (store.py). A page that does not
take its frames within SEND_WITHIN seconds is dropped, and at most MAX_STREAMS follow at once.

Every POST needs `Authorization: Bearer TOKEN`; reads too unless the dashboard listens on a
loopback address. The token is never a cookie (no request another site makes carries it) nor
in a URL. GET changes nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from fairsched.cli.queue_cmds import job_json, json_output
from fairsched.cli.supervisor_cmds import add_process_figures
from fairsched.config import metrics_address
from fairsched.errors import path_name
from fairsched.store.errors import JobNotFound, JobStateError
from fairsched.store.schema import STATUSES
from fairsched.supervisor.status import snapshot
from fairsched.type_names import type_name_problem
from fairsched.web import WebError
from fairsched.web.store import Unavailable, WebStore, history

log = logging.getLogger("fairsched.web")

STATIC = Path(__file__).parent / "static"
TOKEN_FILE = "web_token"
FRAME_EVERY = 1.0  # seconds between two frames of the slots
SEND_WITHIN = 5.0  # seconds a page has to take a frame before it is dropped
STREAM_SEND_BUFFER = 64 << 10  # bytes of the kernel's send buffer for a page's stream
MAX_STREAMS = 32  # pages following the slots at once
MAX_LIMIT = 1000  # jobs one listing gives at most
DEFAULT_LIMIT = 100
MAX_BIGINT = 2**63 - 1
HEADERS = {
    # Nothing but this origin's own files: no inline script, no other site's, no framing.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; base-uri 'none'; "
                               "form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def load_token(settings) -> str:
    """`web_token` from workers.toml, else the one in state_dir/web_token, made (0600) at the
    first start and never written again."""
    if settings.web_token is not None:
        return settings.web_token
    path = settings.state_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        return _stored_token(path)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def _stored_token(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            token = f.read(256).decode("ascii", "replace").strip()
    except OSError as exc:
        raise WebError(f"cannot read the dashboard's token {path_name(path)}: "
                       f"{exc.strerror or exc}") from None
    if len(token) < 16 or not token.isprintable() or " " in token:
        raise WebError(f"{path_name(path)} holds no token (16 printable characters or "
                       "more); delete it for a new one")
    return token


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SlotFeed:
    """The slots as one SSE frame a second, shared by every page that follows them."""

    def __init__(self, sup, figures: ThreadPoolExecutor):
        self.sup = sup
        self.figures = figures
        self.frame = b""
        self.data: dict | None = None  # the frame's, as `ps --json` has it
        self.made_at = -FRAME_EVERY
        self.version = 0
        self.updated = asyncio.Event()
        self.followers = 0
        self.task: asyncio.Task | None = None

    async def next_frame(self, seen: int) -> tuple[bytes, int]:
        """A frame newer than version `seen`, once there is one."""
        while self.version <= seen:
            await self.updated.wait()
        return self.frame, self.version

    def follow(self) -> None:
        self.followers += 1
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    def unfollow(self) -> None:
        self.followers -= 1

    async def latest(self) -> str:
        """The slots as `ps --json` prints them: the feed's last copy if under a second old."""
        if self.data is None or time.monotonic() - self.made_at >= FRAME_EVERY:
            await self._make()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.figures, json_output, self.data)

    async def _make(self) -> None:
        data = snapshot(self.sup)  # on the loop: the actor's state, one pass
        loop = asyncio.get_running_loop()
        self.data, frame = await loop.run_in_executor(self.figures, _figured, data)
        self.made_at = time.monotonic()
        self.frame = frame
        self.version += 1
        updated, self.updated = self.updated, asyncio.Event()
        updated.set()

    async def _run(self) -> None:
        while self.followers > 0:
            started = time.monotonic()
            try:
                await self._make()
            except Exception:  # the page goes stale; the actor must not
                log.exception("web: cannot copy the supervisor's state")
            await asyncio.sleep(max(0.0, FRAME_EVERY - (time.monotonic() - started)))

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass


def _figured(data: dict) -> tuple[dict, bytes]:
    """In a thread: the processes' RSS and CPU read, and the SSE frame encoded."""
    data = add_process_figures(data)
    frame = json.dumps(data, ensure_ascii=True, separators=(",", ":"))
    return data, b"event: ps\ndata: " + frame.encode() + b"\n\n"


def _answer(value, status: int = 200) -> web.Response:
    return web.Response(text=json_output(value), status=status, content_type="application/json")


def _json(text: str) -> web.Response:
    """An answer encoded already (in the dashboard's thread, not on the actor's loop)."""
    return web.Response(text=text, content_type="application/json")


def _one_job(row: dict | None) -> str | None:
    return None if row is None else json_output(job_json(row))


def _error(status: int, message: str) -> web.Response:
    return _answer({"error": message}, status)


def _job_id(request: web.Request) -> int:
    text = request.match_info["id"]
    if not re.fullmatch(r"[0-9]{1,19}", text) or not 1 <= int(text) <= MAX_BIGINT:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"a job id is an integer from 1, "
                                                            f"got {text[:40]!r}"}),
                                 content_type="application/json")
    return int(text)


class Dashboard:
    """The web dashboard of one supervisor: `start` once the actor runs, `close` at shutdown."""

    def __init__(self, sup, address: str, token: str):
        host, self.port, self.ipv6 = metrics_address(address)
        self.host = host
        self.sup = sup
        self.token = token.encode()
        self.loopback = _loopback(host)
        # A page on a loopback address may read without the token: one reached under
        # another name (a rebinding of some site's DNS to 127.0.0.1) may not.
        self.hosts = {f"{name}:{self.port}" for name in
                      ("localhost", "127.0.0.1", "[::1]", host if not self.ipv6 else f"[{host}]")}
        self.figures = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fairsched-web")
        self.feed = SlotFeed(sup, self.figures)
        self.store = WebStore(sup.queue.database_url)
        self.streams: set[asyncio.Task] = set()  # the handlers of the pages following the slots
        self.closing = asyncio.Event()
        self.runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=4096)
        app.router.add_get("/", self.index)
        app.router.add_get("/job/{id}", self.index)
        app.router.add_static("/static/", STATIC, follow_symlinks=False, append_version=False)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_get("/api/ps/stream", self.ps_stream)
        app.router.add_get("/api/counts", self.counts)
        app.router.add_get("/api/history", self.history)
        app.router.add_get("/api/jobs", self.jobs)
        app.router.add_get("/api/jobs/{id}", self.job)
        app.router.add_post("/api/jobs/{id}/retry", self.retry)
        app.router.add_post("/api/jobs/{id}/cancel", self.cancel)
        app.router.add_post("/api/workers/{name}/restart", self.restart)
        app.on_response_prepare.append(self._headers)
        return app

    async def start(self) -> None:
        """Listen; WebError (one line naming the address) when it cannot."""
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                    shutdown_timeout=1.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, backlog=128)
        try:
            await site.start()
        except OSError as exc:
            await self.runner.cleanup()
            self.runner = None
            # asyncio words it "error while attempting to bind on address ...": the errno's.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise WebError(f"[supervisor] web: cannot listen on {self._where()}: "
                           f"{reason}") from None
        log.info("web dashboard on http://%s/", self._where())

    def _where(self) -> str:
        return f"[{self.host}]:{self.port}" if self.ipv6 else f"{self.host}:{self.port}"

    async def close(self) -> None:
        self.closing.set()
        for task in list(self.streams):
            task.cancel()
        await self.feed.close()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        self.store.close()
        self.figures.shutdown(wait=False, cancel_futures=True)

    # -- what every request passes --------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(),
                                                                  self.token)

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self.loopback and request.host not in self.hosts:
            return _error(403, f"this dashboard answers to {self._where()} only")
        reading = request.method in ("GET", "HEAD")
        if (request.path.startswith("/api/") and (not reading or not self.loopback)
                and not self._authorized(request)):
            response = _error(401, "the dashboard's token is needed (Authorization: Bearer "
                                   "TOKEN; [supervisor] web_token, or state_dir/web_token)")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        try:
            return await handler(request)
        except Unavailable as exc:
            return _error(503, str(exc))
        except web.HTTPException as exc:  # no such route, or not by this method
            if (exc.status < 400 or not request.path.startswith("/api/")
                    or exc.content_type == "application/json"):
                raise
            response = _error(exc.status, f"{exc.reason}: {request.method} {request.path[:200]}")
            if "Allow" in exc.headers:
                response.headers["Allow"] = exc.headers["Allow"]
            return response

    async def _headers(self, request: web.Request, response: web.StreamResponse) -> None:
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)

    # -- the page -------------------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    # -- reads ----------------------------------------------------------------------------------

    async def ps(self, request: web.Request) -> web.Response:
        return _json(await self.feed.latest())

    async def ps_stream(self, request: web.Request) -> web.StreamResponse:
        if len(self.streams) >= MAX_STREAMS:
            return _error(503, f"{MAX_STREAMS} pages follow the slots already; try again")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no"})
        task = asyncio.current_task()
        self.streams.add(task)
        self.feed.follow()
        sock = request.transport.get_extra_info("socket") if request.transport else None
        try:
            # What the kernel holds for a page that does not read is bounded too.
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SEND_BUFFER)
            await resp.prepare(request)
            seen = 0
            while not self.closing.is_set():
                frame, seen = await self.feed.next_frame(seen)
                await asyncio.wait_for(resp.write(frame), SEND_WITHIN)
        except TimeoutError:  # it does not read: what it has not taken is dropped
            log.info("web: dropped a page at %s that took no frame for %g s", request.remote,
                     SEND_WITHIN)
            if sock is not None:  # a reset, not the kernel's buffer sent first
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if request.transport is not None:
                request.transport.abort()
        except ConnectionError:  # it went away
            pass
        finally:
            self.streams.discard(task)
            self.feed.unfollow()
        return resp

    async def counts(self, request: web.Request) -> web.Response:
        """As `fairsched jobs --counts --json`, the types of workers.toml with none too."""
        types = self.sup.config.types

        def read(queue) -> str:
            rows = {row["type"]: row for row in queue.depth()}
            for name in types:
                rows.setdefault(name, {"type": name, "pending": 0, "delayed": 0, "running": 0,
                                       "failed": 0, "oldest_wait": None})
            return json_output([rows[name] for name in sorted(rows)])

        return _json(await self.store.read(("counts",), read))

    async def history(self, request: web.Request) -> web.Response:
        """Per minute over the last hour: jobs submitted and finished (by status), by type."""
        rows = await self.store.read(("history",), history)
        now = int(time.time()) // 60 * 60
        minutes = list(range(now - 59 * 60, now + 60, 60))
        index = {minute: i for i, minute in enumerate(minutes)}
        series: dict[str, dict[str, list[int]]] = {}
        for type_name, what, minute, count in rows:
            if minute in index:
                counts = series.setdefault(type_name, {}).setdefault(what, [0] * len(minutes))
                counts[index[minute]] += count
        return _answer({"minutes": minutes, "types": series})

    async def jobs(self, request: web.Request) -> web.Response:
        """As `fairsched jobs --json`: ?status=&type=&limit=."""
        query = request.query
        status = query.get("status") or None
        type_name = query.get("type") or None
        limit_text = query.get("limit") or str(DEFAULT_LIMIT)
        if status is not None and status not in STATUSES:
            return _error(400, f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if type_name is not None and (problem := type_name_problem(type_name)):
            return _error(400, f"type {problem}")
        if not re.fullmatch(r"[0-9]{1,7}", limit_text) or not 1 <= int(limit_text) <= MAX_LIMIT:
            return _error(400, f"limit must be an integer from 1 to {MAX_LIMIT}, got "
                               f"{limit_text[:40]!r}")
        limit = int(limit_text)
        return _json(await self.store.read(("jobs", status, type_name, limit), lambda q: json_output(
            [job_json(row) for row in q.list_jobs(status=status, type=type_name, limit=limit)])))

    async def job(self, request: web.Request) -> web.Response:
        job_id = _job_id(request)
        text = await self.store.read(("job", job_id), lambda q: _one_job(q.get_job(job_id)))
        if text is None:
            return _error(404, str(JobNotFound(job_id)))
        return _json(text)

    # -- actions --------------------------------------------------------------------------------

    async def _act(self, job_id: int, action) -> tuple[object, web.Response | None]:
        """Run `action(queue)` on the job table, as retry and cancel do: (its answer, None), or
        (None, the error answer: 404 for a job that is not there, 409 for one in the wrong
        state). What was kept for the pages is dropped, so they show the change at once."""
        try:
            answer = await self.store.call(action)
        except JobNotFound as exc:
            return None, _error(404, str(exc))
        except JobStateError as exc:
            return None, _error(409, str(exc))
        self.store.changed()
        return answer, None

    async def retry(self, request: web.Request) -> web.Response:
        job_id = _job_id(request)
        type_name, refused = await self._act(job_id, lambda q: q.retry_job(job_id))
        if refused is not None:
            return refused
        log.info("web: job %d retried (%s)", job_id, type_name)
        return _answer({"id": job_id, "status": "pending"})

    async def cancel(self, request: web.Request) -> web.Response:
        job_id = _job_id(request)
        status, refused = await self._act(job_id, lambda q: q.cancel_job(job_id))
        if refused is not None:
            return refused
        log.info("web: job %d %s", job_id, "cancelled" if status == "cancelled"
                 else "is running: cancel requested")
        return _answer({"id": job_id, "status": status})

    async def restart(self, request: web.Request) -> web.Response:
        sup = self.sup
        name = request.match_info["name"]
        if sup.shutting_down:
            return _error(409, "the supervisor is shutting down: nothing restarts")
        names = sup.workers.restart(name)
        if not names:
            known = sorted({p.group for p in sup.workers.procs} | {p.name for p in sup.workers.procs})
            return _error(404, f"no worker or group named {name[:80]!r} "
                               f"(known: {', '.join(known)})")
        return _answer({"restarted": names})
