"""The command line that starts one sandboxed run, for each mechanism.

Owns what the sandbox sees (:func:`system_view`: read-only binds of ``/usr``, the
top-level links or folders beside it, the Python installation and its virtual
environment, two files of ``/etc``; nothing else of the host: not ``/home``, ``/root``,
``/tmp``, the run directory or the project), and :func:`command`, the argv,
working directory and environment of one run under ``bwrap``, ``unshare`` or as a
plain process. The program inside is :mod:`agentrl.sandbox.inside`; starting,
deadlines and output are :mod:`agentrl.sandbox.runner`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import marshal
import os
import shutil
import site
import sys
from pathlib import Path

from agentrl.sandbox.limits import Mechanism, SandboxLimits, SandboxPolicy

WORKDIR = "/sandbox"
"""The working directory inside (a tmpfs of ``max_disk_bytes``): also HOME and TMPDIR."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("/etc/ld.so.cache", "/etc/localtime")
_ETC_NETWORK = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl")


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """The host paths a run sees, read-only and at the same place."""

    binds: tuple[str, ...]
    symlinks: tuple[tuple[str, str], ...]
    """(path, target) pairs recreated inside, e.g. ``/lib`` -> ``usr/lib``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    """What to start for one run: its argv, working directory and whole environment."""

    argv: list[str]
    cwd: str
    env: dict[str, str]


HOST_UID = 65534
"""The host uid and gid sandboxed code runs as when agentrl runs as root (``nobody``).

As root, a user namespace alone is not enough: uid 65534 inside it is uid 0 outside, and
the kernel checks files such as ``/proc/sys/kernel/core_pattern`` against the host uid.
So as root neither mechanism makes a user namespace first: each builds the sandbox's
root as real root, then the program inside becomes this uid on the host, with every
capability gone, before it enters a user namespace of its own (``inside.py``)."""


def host_uid() -> int | None:
    """The host uid the sandbox must drop to: :data:`HOST_UID` as root, else None (an
    unprivileged user's sandbox runs as that user outside its user namespace)."""
    return HOST_UID if os.geteuid() == 0 else None


@functools.cache
def system_view(network: bool) -> View:
    """``/usr``, the top-level links or folders beside it, the interpreter's prefixes
    (the venv's packages are importable as before) and a few ``/etc`` files."""
    binds: list[str] = ["/usr"]
    symlinks: list[tuple[str, str]] = []
    for path in (*_TOP_LEVEL, *_ETC, *(_ETC_NETWORK if network else ())):
        if os.path.islink(path):
            symlinks.append((path, os.readlink(path)))
        elif os.path.exists(path):
            binds.append(path)
    for prefix in (sys.base_prefix, sys.prefix):
        real = os.path.realpath(prefix)
        if not any(real == b or real.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(real)
        if real != prefix:
            symlinks.append((prefix, real))
    return View(tuple(binds), tuple(symlinks))


@functools.cache
def site_packages() -> list[str]:
    """This interpreter's site-packages folders (the venv's first): importable inside."""
    return [p for p in site.getsitepackages() if os.path.isdir(p)]


AUDIT_IMPORT = "from agentrl.sandbox.audit import install_audit_hook\n"


@functools.cache
def inside_source() -> str:
    """The source of :mod:`agentrl.sandbox.inside`, run with ``python -c``: one script, with
    :mod:`agentrl.sandbox.audit`'s source in place of its import (agentrl is not importable
    inside)."""
    folder = Path(__file__).parent
    inside, audit = (folder / "inside.py").read_text(), (folder / "audit.py").read_text()
    if AUDIT_IMPORT not in inside:
        raise RuntimeError(f"sandbox: inside.py lacks the line {AUDIT_IMPORT!r} to splice into")
    return inside.replace(AUDIT_IMPORT, audit, 1)


def environment(workdir: str) -> dict[str, str]:
    """The whole environment of a run: nothing of the parent's (its secrets)."""
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }


def command(
    mechanism: Mechanism, host_dir: str, limits: SandboxLimits, policy: SandboxPolicy
) -> Command:
    """How to start one run. ``host_dir`` is an empty private folder of the host: the
    working directory of a ``process`` run, a mount point for ``unshare``, unused by
    ``bwrap``."""
    workdir = host_dir if mechanism == "process" else WORKDIR
    spec: dict[str, object] = {
        "mechanism": mechanism,
        "workdir": workdir,
        "network": policy.network,
        "audit_hook": policy.audit_hook,
        "disk": {"bytes": limits.max_disk_bytes, "files": limits.max_files},
        "paths": site_packages(),
        "limits": {
            name: getattr(limits, name)
            for name in (
                "cpu_s",
                "memory_bytes",
                "max_file_bytes",
                "max_open_files",
                "max_processes",
            )
        },
    }
    if mechanism != "process":
        spec["host_uid"] = host_uid()
    if mechanism == "unshare":
        view = system_view(policy.network)
        spec["root"] = {
            "mountpoint": host_dir,
            "binds": view.binds,
            "symlinks": view.symlinks,
            "devices": DEVICES,
        }
    # -S: no site module; the venv's .pth start-up hooks (an editable install's finder)
    # would double the start-up. Its site-packages go on sys.path inside instead.
    python = [sys.executable, "-I", "-S", "-B", "-c", inside_source()]
    python.append(marshal.dumps(spec).hex())  # the spec, read by the same interpreter
    env = environment(workdir)
    if mechanism == "bwrap":
        argv = [*_bwrap(limits, policy, env), "--", *python]
        return Command(argv, host_dir, {"PATH": env["PATH"]})  # bwrap sets the rest
    if mechanism == "unshare":
        return Command([*_unshare(policy), "--", *python], host_dir, env)
    return Command(python, host_dir, env)


def _bwrap(limits: SandboxLimits, policy: SandboxPolicy, env: dict[str, str]) -> list[str]:
    view = system_view(policy.network)
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if not policy.network:
        argv.append("--unshare-net")
    if host_uid() is None:
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    else:  # as root: only what the program needs to become HOST_UID, gone right after
        argv += [
            "--cap-drop",
            "ALL",
            "--cap-add",
            "CAP_SETUID",
            "--cap-add",
            "CAP_SETGID",
            "--cap-add",
            "CAP_SETPCAP",
        ]
    argv += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    # bwrap makes a bind's missing parents 0700: uid 65534 could not pass /root to reach
    # an interpreter under /root/.pyenv. Make them 0755 first (empty folders of its tmpfs).
    parents = {str(p) for path in view.binds for p in Path(path).parents if str(p) != "/"}
    for parent in sorted(parents, key=lambda p: p.count("/")):
        argv += ["--perms", "0755", "--dir", parent]
    for path in view.binds:
        argv += ["--ro-bind", path, path]
    for path, target in view.symlinks:
        argv += ["--symlink", target, path]
    # /dev gets a few nodes on its own tmpfs: read-only, so it cannot be written to fill.
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    if host_uid() is not None:  # kernel settings read-only, whatever uid is inside
        argv += ["--ro-bind", "/proc/sys", "/proc/sys"]
    argv += ["--size", str(limits.max_disk_bytes), "--perms", "0700", "--tmpfs", WORKDIR]
    return [*argv, "--chdir", WORKDIR, "--remount-ro", "/"]


def _unshare(policy: SandboxPolicy) -> list[str]:
    # As root, no user namespace here: the program builds its root as real root, then
    # drops to HOST_UID (inside.enter_new_root); otherwise it is root of a new one.
    user = ["--user", "--map-root-user"] if host_uid() is None else []
    argv = [
        shutil.which("unshare") or "unshare",
        *user,
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--ipc",
        "--uts",
        "--cgroup",
    ]
    return argv if policy.network else [*argv, "--net"]
