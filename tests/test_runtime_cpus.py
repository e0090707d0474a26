"""CPUs this process can use: affinity within the cgroup CPU quota (v1 and v2), read from
a fake ``/proc/self`` and cgroup tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.runtime import cpus
from engines.runtime.cpus import available_cpus, cgroup_cpu_limit

V1_CGROUP = "12:pids:/\n4:memory:/x\n3:cpu,cpuacct:{path}\n0::/\n"
V2_CGROUP = "0::{path}\n"


def mountinfo(*mounts: tuple[str, str, str, str]) -> str:
    """Lines of /proc/self/mountinfo: (fstype, root, mount point, super options)."""
    lines = ["22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw"]
    for i, (fstype, root, point, opts) in enumerate(mounts):
        lines.append(f"{30 + i} 22 0:{40 + i} {root} {point} rw,nosuid shared:{i} - {fstype} "
                     f"{fstype} {opts}")  # fmt: skip
    return "\n".join(lines) + "\n"


def proc(tmp_path: Path, cgroup: str, mounts: str) -> Path:
    d = tmp_path / "proc"
    d.mkdir(exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    (d / "mountinfo").write_text(mounts)
    return d


def v1_limit(d: Path, quota: int, period: int = 100_000) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (d / "cpu.cfs_period_us").write_text(f"{period}\n")


def test_v1_quota_of_the_process_cgroup(tmp_path: Path) -> None:
    root = tmp_path / "cg" / "cpu,cpuacct"
    v1_limit(root, -1)
    v1_limit(root / "docker" / "abc", 150_000)
    p = proc(tmp_path, V1_CGROUP.format(path="/docker/abc"),
             mountinfo(("cgroup", "/", str(root), "rw,cpu,cpuacct")))  # fmt: skip
    assert cgroup_cpu_limit(p) == pytest.approx(1.5)


def test_v1_an_ancestors_smaller_quota_applies(tmp_path: Path) -> None:
    root = tmp_path / "cg" / "cpu"
    v1_limit(root / "slice", 50_000, 100_000)  # half a CPU for the whole slice
    v1_limit(root / "slice" / "svc", 400_000, 100_000)
    p = proc(tmp_path, V1_CGROUP.format(path="/slice/svc"),
             mountinfo(("cgroup", "/", str(root), "rw,cpu")))  # fmt: skip
    assert cgroup_cpu_limit(p) == pytest.approx(0.5)


def test_v1_unlimited_and_other_controllers_are_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "cg" / "cpu"
    v1_limit(root / "a", -1)
    mem = tmp_path / "cg" / "memory"
    v1_limit(mem / "a", 10_000)  # a memory hierarchy with cpu files: not the cpu controller
    p = proc(tmp_path, V1_CGROUP.format(path="/a"),
             mountinfo(("cgroup", "/", str(mem), "rw,memory"),
                       ("cgroup", "/", str(root), "rw,cpu")))  # fmt: skip
    assert cgroup_cpu_limit(p) is None


def test_v1_namespaced_mount_root(tmp_path: Path) -> None:
    """Inside a container the mount's root is the container's own cgroup."""
    root = tmp_path / "cg" / "cpu"
    v1_limit(root, 200_000, 100_000)
    p = proc(tmp_path, V1_CGROUP.format(path="/docker/abc"),
             mountinfo(("cgroup", "/docker/abc", str(root), "rw,cpu,cpuacct")))  # fmt: skip
    assert cgroup_cpu_limit(p) == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("content", "want"),
    [("max 100000\n", None), ("250000 100000\n", 2.5), ("50000 100000", 0.5), ("junk", None)],
)
def test_v2_cpu_max(tmp_path: Path, content: str, want: float | None) -> None:
    root = tmp_path / "cg2"
    leaf = root / "system.slice" / "tts.service"
    leaf.mkdir(parents=True)
    (leaf / "cpu.max").write_text(content)
    p = proc(tmp_path, V2_CGROUP.format(path="/system.slice/tts.service"),
             mountinfo(("cgroup2", "/", str(root), "rw,nsdelegate")))  # fmt: skip
    got = cgroup_cpu_limit(p)
    assert got == (None if want is None else pytest.approx(want))


def test_missing_files_are_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "nowhere") is None
    p = proc(tmp_path, V1_CGROUP.format(path="/gone"),
             mountinfo(("cgroup", "/", str(tmp_path / "absent"), "rw,cpu")))  # fmt: skip
    assert cgroup_cpu_limit(p) is None


@pytest.mark.parametrize(("quota", "want"), [(50_000, 1), (150_000, 1), (100_000, 1),
                                             (10**9, None)])  # fmt: skip
def test_available_cpus_rounds_the_quota_down_within_the_affinity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quota: int, want: int | None
) -> None:
    monkeypatch.setattr(cpus, "affinity_cpus", lambda: 4 if want is None else 2)
    root = tmp_path / "cg" / "cpu"
    v1_limit(root / "c", quota)
    p = proc(tmp_path, V1_CGROUP.format(path="/c"),
             mountinfo(("cgroup", "/", str(root), "rw,cpu")))  # fmt: skip
    assert available_cpus(p) == (4 if want is None else want)


def test_this_process() -> None:
    """The real /proc: never more than the affinity, never less than one."""
    n = available_cpus()
    assert 1 <= n <= len(os.sched_getaffinity(0))


lines = st.text(alphabet=st.sampled_from("0123456789:/,- abcgrouptmaxcpu\n"), max_size=300)


@settings(max_examples=200, deadline=None)
@given(cgroup=lines, mounts=lines, limit=lines)
def test_any_file_content_reads_without_raising(
    tmp_path_factory: pytest.TempPathFactory, cgroup: str, mounts: str, limit: str
) -> None:
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "cg"
    (root / "a").mkdir(parents=True)
    for name in ("cpu.max", "cpu.cfs_quota_us", "cpu.cfs_period_us"):
        (root / "a" / name).write_text(limit)
    p = proc(base, cgroup + "\n3:cpu:/a\n0::/a\n",
             mounts + mountinfo(("cgroup", "/", str(root), "rw,cpu"),
                                ("cgroup2", "/", str(root), "rw")))  # fmt: skip
    got = cgroup_cpu_limit(p)
    assert got is None or got > 0
