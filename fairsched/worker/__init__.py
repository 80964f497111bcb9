"""The worker side: the Python runtime that runs handlers, and the launcher that starts workers.

`python -m fairsched.worker` is a Python worker; `fairsched.worker.launch` starts workers for
the supervisor. docs/protocol.md describes what passes between the two.
"""
