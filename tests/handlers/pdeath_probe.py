"""Run as a subprocess: start a worker, keep its socket open elsewhere, then exit.

With the supervisor end of the socket held by a `sleep` (so the worker sees no EOF), only the
parent-death signal can end the worker once this process is gone. Argument: "cold" (launch)
or "template" (subreaper + template spawn). Prints {"worker": pid, "holder": pid, "dir": ...}.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[2])]  # this checkout

from worker_peer import Peer, make_spec, spawn  # noqa: E402

from fairsched.supervisor.template_process import Template  # noqa: E402
from fairsched.worker.launch import become_subreaper, launch  # noqa: E402


def main(mode: str) -> None:
    folder = tempfile.mkdtemp(prefix="fs-pdeath-")
    spec = make_spec(Path(folder))
    if mode == "template":
        assert become_subreaper()
        template = Template.start(spec)
        launched = spawn(template, spec, "inc-1")
    else:
        launched = launch(spec, "inc-1")
    peer = Peer(launched, "inc-1", spec)
    peer.hello()
    holder = subprocess.Popen(["sleep", "30"], pass_fds=[peer.sock.fileno()],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(json.dumps({"worker": peer.pid, "holder": holder.pid, "dir": folder}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
