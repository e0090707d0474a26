"""How many CPUs this process can use: its affinity, within its cgroup's CPU quota.

Rule: pure parsing of the kernel's text files, given as paths (tests hand in a
fake ``/proc`` and cgroup tree); nothing is cached, nothing raises on odd
content (an unreadable or unexpected file counts as "no limit").

Why the quota matters. A container with a CPU limit (Docker ``--cpus``,
Kubernetes ``limits.cpu``, a systemd ``CPUQuota=``) sees every core of the host
in its affinity, but the kernel lets its threads run only ``quota / period``
CPUs' worth of time per period and then stalls them all until the next one.
An engine that starts a worker and intra-op threads per visible core there
decodes in bursts and stalls mid-sentence; one that sizes itself by the quota
runs smoothly at the speed the limit allows. The quota is rounded down (at
least 1), as Go's automaxprocs does: a thread that would need the fraction
above it would be throttled.

Both cgroup versions are read: v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``
in the ``cpu`` controller's hierarchy) and v2 (``cpu.max``, "max 100000" or
"50000 100000"); every ancestor's limit applies, so the smallest along the
path up to the mount point counts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

PROC_SELF = Path("/proc/self")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _v1_limit(d: Path) -> float | None:
    quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    try:
        q, p = int(quota.strip()), int(period.strip())
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v2_limit(d: Path) -> float | None:
    text = _read(d / "cpu.max")
    if text is None:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        q, p = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """(fstype, root, mount point, super options) of each cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] in ("cgroup", "cgroup2"):
            out.append((tail[0], fields[3], fields[4], tail[2]))
    return out


def _limit_along(
    mount: Path, root: str, path: str, limit_of: Callable[[Path], float | None]
) -> float | None:
    """The smallest limit from the cgroup ``path``'s directory up to the mount point."""
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root.rstrip("/")) :]  # a namespaced mount shows its own root
    rel = [p for p in path.split("/") if p and p not in (".", "..")]
    best: float | None = None
    for depth in range(len(rel), -1, -1):
        limit = limit_of(mount.joinpath(*rel[:depth]))
        if limit is not None and (best is None or limit < best):
            best = limit
    return best


def cgroup_cpu_limit(proc: Path = PROC_SELF) -> float | None:
    """CPUs' worth of time the cgroup quota allows this process (may be fractional);
    None when no quota applies or it cannot be read."""
    cgroup, mountinfo = _read(proc / "cgroup"), _read(proc / "mountinfo")
    if cgroup is None or mountinfo is None:
        return None
    mounts = _mounts(mountinfo)
    limits: list[float] = []
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            for fstype, root, point, _ in mounts:
                if fstype == "cgroup2":
                    found = _limit_along(Path(point), root, path, _v2_limit)
                    if found is not None:
                        limits.append(found)
        elif "cpu" in controllers.split(","):
            for fstype, root, point, opts in mounts:
                if fstype == "cgroup" and "cpu" in opts.split(","):
                    found = _limit_along(Path(point), root, path, _v1_limit)
                    if found is not None:
                        limits.append(found)
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count`` elsewhere)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def available_cpus(proc: Path = PROC_SELF) -> int:
    """Cores this process can keep busy: its affinity, within its cgroup CPU quota
    (rounded down, at least 1)."""
    cores = affinity_cpus()
    limit = cgroup_cpu_limit(proc)
    if limit is None:
        return cores
    return max(1, min(cores, math.floor(limit + 1e-9)))
