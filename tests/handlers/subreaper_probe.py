"""Run as a subprocess: become a subreaper, spawn a worker from a template, report as JSON.

The test process itself must not become a subreaper (it would inherit every orphan of every
other test), hence this separate process. Prints {"parent": ..., "me": ..., "exit": ...}.
"""

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[2])]  # this checkout

from worker_peer import Peer, make_spec, spawn  # noqa: E402

from fairsched.supervisor.template_process import Template  # noqa: E402
from fairsched.worker.launch import become_subreaper  # noqa: E402


def main() -> None:
    assert become_subreaper()
    log_dir = Path(tempfile.mkdtemp(prefix="fs-probe-"))
    spec = make_spec(log_dir)
    template = Template.start(spec)
    peer = None
    try:
        peer = Peer(spawn(template, spec, "probe-1"), "probe-1", spec)
        hello = peer.hello()
        with open(f"/proc/{peer.pid}/stat") as f:
            parent = int(f.read().rpartition(")")[2].split()[1])
        peer.run(1)
        result = peer.expect("result")["result"]
        peer.send({"t": "stop"})
        code = peer.wait_exit()  # waitpid works: the worker is our child
        print(json.dumps({"parent": parent, "me": os.getpid(), "exit": code,
                          "hello_pid": hello["pid"], "worker": peer.pid,
                          "template": template.pid, "imported_in": result["imported_in"]}))
    finally:
        if peer is not None:
            peer.cleanup()
        template.close()
        try:
            os.waitpid(template.pid, 0)
        except ChildProcessError:
            pass
        for pid in _children():  # nothing of ours may outlive the probe
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(log_dir, ignore_errors=True)


def _children() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rpartition(")")[2].split()[1]) == os.getpid():
                        found.append(int(entry))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return found


if __name__ == "__main__":
    main()
