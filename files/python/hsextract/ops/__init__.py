"""Host operations the Ansible roles run before a server starts: freeing its port, checking /dev/shm.

Each module is a pure core (a plan or a verdict computed from plain data) plus a thin adapter that
reads the live system with psutil / os.statvfs, so the decisions are unit-tested without a host.
"""
