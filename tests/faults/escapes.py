"""The attacks of the escape suite: model-written programs, and how the host tells that
one got out.

Each :class:`Attack` is a program (a :class:`string.Template` over :meth:`Host.values`)
and a ``breaches`` check run on the host afterwards: it looks at the host itself (the
file is not there, no connection is waiting, the victim process is alive and untraced,
no signal arrived) and at what the program reported on its ``REPORT`` line, never only
at an error message. ``process``: the plain-process fallback claims to stop this one
too (seccomp, rlimits, the hook); ``hook``: the attack is on the audit hook itself, so
it runs with the hook on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from string import Template

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class Host:
    """What the attacks aim at, set up by the test on the host."""

    dir: Path
    secret: str
    token: str
    victim_file: Path
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    unix_path: Path
    victim: subprocess.Popen[bytes]
    signals: list[int]
    shadow_line: str
    env_markers: list[str]

    @property
    def target(self) -> Path:
        return self.dir / "escaped.txt"

    @property
    def outside_paths(self) -> list[str]:
        """Places outside the sandbox an attack tries to write (removed afterwards)."""
        name = f"agentrl-escape-{self.token}"
        return [
            str(self.target),
            f"/tmp/{name}",
            f"/dev/shm/{name}",
            f"/var/tmp/{name}",
            str(ROOT / name),
            f"/root/{name}",
            str(self.dir / "newdir"),
        ]

    def values(self) -> dict[str, str]:
        return {
            "target": repr(str(self.target)),
            "victim_file": repr(str(self.victim_file)),
            "dir": repr(str(self.dir)),
            "root": repr(str(ROOT)),
            "pid": str(os.getpid()),
            "victim": str(self.victim.pid),
            "tcp_port": str(self.tcp.getsockname()[1]),
            "udp_port": str(self.udp.getsockname()[1]),
            "unix_path": repr(str(self.unix_path)),
            "outside": repr(self.outside_paths),
            "planted": repr([str(p) for p in self.planted]),
        }

    @property
    def planted(self) -> list[Path]:
        """Secrets an agent must not reach: keys, cloud credentials, a run's store."""
        return [
            self.dir / "home/.ssh/id_ed25519",
            self.dir / "home/.aws/credentials",
            self.dir / "run/episodes.sqlite",
            self.dir / "run/config.toml",
        ]

    def tracer_of_victim(self) -> int:
        status = Path(f"/proc/{self.victim.pid}/status").read_text()
        return int(status.split("TracerPid:")[1].split()[0])


def report(output: str) -> dict:
    """The program's ``REPORT {json}`` line ({} if it never got there)."""
    for line in reversed(output.splitlines()):
        if line.startswith("REPORT "):
            return json.loads(line[len("REPORT ") :])
    return {}


def _waiting(sock: socket.socket) -> bool:
    """A connection (or datagram) reached this socket of the host."""
    return bool(select.select([sock], [], [], 0.3)[0])


@dataclasses.dataclass(frozen=True)
class Attack:
    name: str
    code: str
    breaches: Callable[[str, Host], list[str]]
    process: bool = False
    hook: bool = False

    def program(self, host: Host) -> str:
        return Template(self.code).substitute(host.values())


def _no_secret(out: str, host: Host) -> list[str]:
    return ["the secret was read"] if host.secret in out else []


def _nothing_outside(out: str, host: Host) -> list[str]:
    return [f"{p} was written" for p in host.outside_paths if os.path.lexists(p)]


def _victim_intact(out: str, host: Host) -> list[str]:
    found = []
    if not host.victim_file.exists() or host.victim_file.read_text() != "precious":
        found.append("the host's file was deleted or changed")
    elif host.victim_file.stat().st_mode & 0o777 != 0o644:
        found.append("the host's file changed mode")
    return found


def _no_shadow(out: str, host: Host) -> list[str]:
    return ["/etc/shadow was read"] if host.shadow_line in out else []


def _kernel_settings_changed(said: dict) -> list[str]:
    """A host sysctl the program says it wrote (put back here), or sysrq reached."""
    found = []
    for path in ("/proc/sys/kernel/core_uses_pid", "/proc/sys/vm/swappiness"):
        if said.get(path) == repr("written"):
            found.append(f"{path} was written on the host")
            with contextlib.suppress(OSError):
                Path(path).write_text(said["before " + path])
    if "sysrq" in said and not said["sysrq"].startswith("failed"):
        found.append("/proc/sysrq-trigger was written")
    return found


PROLOGUE = "import ctypes, json, os, signal, socket, subprocess, sys\nreport = {}\n"
TRY = """
def attempt(key, fn):
    try:
        report[key] = repr(fn())[:300]
    except BaseException as e:
        report[key] = f"failed: {type(e).__name__}: {e}"
"""
EPILOGUE = "\nprint('REPORT', json.dumps(report))\n"


def _attack(
    name: str,
    body: str,
    *checks: Callable[[str, Host], list[str]],
    process: bool = False,
    hook: bool = False,
) -> Attack:
    def breaches(out: str, host: Host) -> list[str]:
        return [b for check in checks for b in check(out, host)]

    return Attack(name, PROLOGUE + TRY + body + EPILOGUE, breaches, process, hook)


ATTACKS = [
    _attack(
        "write outside the working directory (host tmp, /dev/shm, project, /root)",
        """
for path in $outside:
    attempt(path, lambda: open(path, "w").write("escaped"))
attempt("mkdir", lambda: os.mkdir($dir + "/newdir"))
""",
        _nothing_outside,
    ),
    _attack(
        "delete, rename, chmod or truncate a host file",
        """
for op in (os.remove, lambda p: os.rename(p, p + ".moved"), lambda p: os.chmod(p, 0),
           lambda p: os.truncate(p, 0), lambda p: os.unlink(p)):
    attempt(str(op), lambda: op($victim_file))
import shutil
attempt("rmtree", lambda: shutil.rmtree($dir))
""",
        _victim_intact,
    ),
    _attack(
        "read /etc/shadow (as root in CI)",
        """
for path in ("/etc/shadow", "/etc/gshadow", "/etc/sudoers"):
    attempt(path, lambda: open(path).read())
""",
        _no_shadow,
    ),
    _attack(
        "read the project's files",
        """
attempt("pyproject", lambda: open($root + "/pyproject.toml").read())
attempt("source", lambda: open($root + "/agentrl/sandbox/runner.py").read())
attempt("listing", lambda: os.listdir($root))
""",
        lambda out, host: (
            ["a project file was read"]
            if "[tool.importlinter]" in out
            or "def run_python(" in out
            or "pyproject.toml" in str(report(out).get("listing"))
            else []
        ),
    ),
    _attack(
        "read ssh keys, cloud credentials, the run directory and its episode store",
        """
for path in $planted + ["/root/.ssh/id_rsa", "/root/.aws/credentials", "/root/.netrc"]:
    attempt(path, lambda: open(path, "rb").read())
attempt("run dir", lambda: os.listdir($dir + "/run"))
""",
        _no_secret,
        lambda out, host: (
            ["the run directory was listed"]
            if "episodes.sqlite" in str(report(out).get("run dir"))
            else []
        ),
    ),
    _attack(
        "read the parent's environment (secrets)",
        """
attempt("environ", lambda: dict(os.environ))
for pid in ("self", "1", str(os.getppid()), "$pid"):
    attempt(pid, lambda: open(f"/proc/{pid}/environ", "rb").read())
""",
        _no_secret,
        lambda out, host: [
            f"the host's environment leaked ({m})" for m in host.env_markers if m in out
        ],
    ),
    _attack(
        "inspect host processes through /proc",
        """
report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in ($pid, $victim):
    for what in ("cmdline", "status", "maps", "mem"):
        attempt(f"{pid}/{what}", lambda: open(f"/proc/{pid}/{what}", "rb").read(64))
    attempt(f"{pid}/root", lambda: os.listdir(f"/proc/{pid}/root/"))
    attempt(f"{pid}/cwd", lambda: os.readlink(f"/proc/{pid}/cwd"))
""",
        lambda out, host: (
            [
                f"host PID {p} is visible"
                for p in (os.getpid(), host.victim.pid)
                if p in report(out).get("pids", [p])
            ]
            + [k for k, v in report(out).items() if k != "pids" and not v.startswith("failed")]
        ),
    ),
    _attack(
        "start programs (shell, id, exec, posix_spawn, ctypes execve)",
        """
marker = "echo $$((6 * 7 * 1000 + 1))"
attempt("run", lambda: subprocess.run(["/bin/sh", "-c", marker], capture_output=True).stdout)
attempt("system", lambda: os.system(marker))
attempt("spawn", lambda: os.posix_spawn("/usr/bin/touch", ["touch", $dir + "/ran"], {}))
attempt("popen id", lambda: os.popen("/usr/bin/id").read())
libc = ctypes.CDLL(None, use_errno=True)
argv = (ctypes.c_char_p * 3)(b"/usr/bin/touch", ($dir + "/ran").encode(), None)
attempt("execve", lambda: libc.execve(b"/usr/bin/touch", argv, None))
attempt("execv", lambda: os.execv("/bin/sh", ["sh", "-c", marker]))
""",
        lambda out, host: (
            (["a program ran"] if "42001" in out or "uid=" in out else [])
            + (["a program touched the host"] if (host.dir / "ran").exists() else [])
        ),
        process=True,
    ),
    _attack(
        "fork bomb (fork, multiprocessing, clone via ctypes)",
        """
forked = 0
for _ in range(200):
    try:
        if os.fork() == 0:
            import time; time.sleep(30); os._exit(0)
        forked += 1
    except OSError as e:
        report["fork"] = e.strerror
report["forked"] = forked
import multiprocessing
attempt("multiprocessing", lambda: multiprocessing.Process(target=print).start())
attempt("vfork", lambda: ctypes.CDLL(None).vfork())
""",
        lambda out, host: [] if report(out).get("forked") == 0 else ["a process was forked"],
        process=True,
    ),
    _attack(
        "memory exhaustion",
        """
attempt("4 GiB", lambda: len(bytearray(4 << 30)))
import mmap
chunks = []
try:  # mapped, not written: the address-space limit counts them all the same, and
    # writing 64 MiB chunks up to the limit could use up the CPU limit first (SIGXCPU
    # before the report, on a loaded machine)
    while len(chunks) < 64:
        chunks.append(mmap.mmap(-1, 64 << 20))
except (MemoryError, OSError):
    pass
report["allocated MiB"] = 64 * len(chunks)
attempt("mmap 4 GiB", lambda: len(mmap.mmap(-1, 4 << 30)))
""",
        lambda out, host: (
            []
            if report(out).get("allocated MiB", 0) <= 512
            and "4 GiB" in report(out)
            and report(out)["4 GiB"].startswith("failed")
            and report(out)["mmap 4 GiB"].startswith("failed")
            else ["memory limit not held"]
        ),
        process=True,
    ),
    _attack(
        "raise its own limits, then exhaust memory",
        """
import resource
for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE"):
    limit = getattr(resource, name)
    attempt(name, lambda: resource.setrlimit(limit, (resource.RLIM_INFINITY,) * 2))
attempt("2 GiB", lambda: len(bytearray(2 << 30)))
""",
        lambda out, host: (
            []
            if str(report(out).get("2 GiB", "failed")).startswith("failed")
            else ["an rlimit was raised"]
        ),
        process=True,
    ),
    _attack(
        "fill the disk with many small files, empty files and one big file",
        """
for prefix, data in (("small", "x" * 100), ("empty", "")):
    n = 0
    try:
        while n < 100_000:
            with open(f"{prefix}{n}", "w") as f:
                f.write(data)
            n += 1
    except OSError as e:
        report[prefix + " error"] = e.strerror
    report[prefix] = n
    for i in range(n):
        os.remove(f"{prefix}{i}")
attempt("big", lambda: open("big", "wb").write(bytes(256 << 20)))
""",
        lambda out, host: (
            []
            if report(out).get("small", 1 << 20) <= 1024
            and report(out).get("empty", 1 << 20) <= 512
            and str(report(out).get("big", "failed")).startswith("failed")
            else [f"disk limits not held: {report(out)}"]
        ),
    ),
    _attack(
        "reach the network: TCP and UDP on loopback, a host Unix socket",
        """
for host in ("127.0.0.1", "localhost"):
    attempt(f"tcp {host}", lambda: socket.create_connection((host, $tcp_port), timeout=1))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b"x", ("127.0.0.1", $udp_port)))
def unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect($unix_path)
attempt("unix", unix)
attempt("raw socket()", lambda: ctypes.CDLL(None).socket(2, 1, 0))
""",
        lambda out, host: [
            name
            for name, sock in (("TCP", host.tcp), ("UDP", host.udp), ("Unix", host.unix))
            if _waiting(sock)
        ],
        process=True,
    ),
    _attack(
        "signal the parent and another process",
        """
attempt("victim", lambda: os.kill($victim, signal.SIGKILL))
attempt("test", lambda: os.kill($pid, signal.SIGUSR1))
attempt("parent", lambda: os.kill(os.getppid(), signal.SIGUSR1))
attempt("ctypes", lambda: ctypes.CDLL(None).kill($victim, 9))
attempt("pidfd", lambda: os.pidfd_open($victim))
""",
        lambda out, host: (
            (["the victim was killed"] if host.victim.poll() is not None else [])
            + (["the test process got a signal"] if host.signals else [])
        ),
        process=True,
    ),
    _attack(
        "ptrace, kernel keyring, mount and namespaces through ctypes",
        """
libc = ctypes.CDLL(None, use_errno=True)
x86 = os.uname().machine == "x86_64"
calls = {
    "ptrace attach": lambda: libc.ptrace(16, $victim, 0, 0),
    "unshare user": lambda: libc.unshare(0x10000000),
    "unshare mount": lambda: libc.unshare(0x00020000),
    "mount tmpfs": lambda: libc.mount(b"none", b"/usr", b"tmpfs", 0, None),
    "chroot": lambda: libc.chroot(b"/"),
    "keyctl": lambda: libc.syscall(250 if x86 else 219, 0, -4, 0),
    "bpf": lambda: libc.syscall(321 if x86 else 280, 0, 0, 0),
    "io_uring": lambda: libc.syscall(425, 8, ctypes.create_string_buffer(120)),
}
for name, call in calls.items():
    attempt(name, call)
""",
        lambda out, host: (
            [f"{k} succeeded" for k, v in report(out).items() if v != "-1"]
            + (["the victim is traced"] if host.tracer_of_victim() else [])
        ),
        process=True,
    ),
    _attack(
        "symlink and hard-link tricks out of the working directory",
        """
for name, target in (("s1", "/etc/shadow"), ("s2", $target), ("r", "/"),
                     ("pr", f"/proc/$pid/root")):
    attempt("link " + name, lambda: os.symlink(target, name))
attempt("read s1", lambda: open("s1").read())
attempt("write s2", lambda: open("s2", "w").write("escaped"))
attempt("read r", lambda: open("r/etc/shadow").read())
attempt("write pr", lambda: open("pr" + $target, "w").write("escaped"))
attempt("hard link", lambda: os.link($victim_file, "hard"))
attempt("write hard", lambda: open("hard", "w").write("overwritten"))
""",
        _nothing_outside,
        _victim_intact,
        _no_shadow,
    ),
    _attack(
        "rebind the guard's names, then write, run a program, connect",
        """
import builtins
for name in ("_root", "_inside", "_guard", "_REFUSED", "_PATH_EVENTS", "_own_proc",
             "guard", "inside", "refused", "REFUSED", "install_audit_hook"):
    globals()[name] = None
    setattr(sys.modules["__main__"], name, None)
builtins.isinstance = lambda obj, kinds: False
builtins.any = lambda items: False
builtins.PermissionError = KeyError
attempt("write", lambda: open($target, "w").write("escaped"))
attempt("program", lambda: subprocess.run(["/usr/bin/touch", $dir + "/ran"]))
attempt("connect", lambda: socket.create_connection(("127.0.0.1", $tcp_port), timeout=1))
""",
        _nothing_outside,
        lambda out, host: (
            (
                ["the hook was turned off"]
                if "sandbox: writing outside the working directory" not in out
                else []
            )
            + (["a program ran"] if (host.dir / "ran").exists() else [])
            + (["connected"] if _waiting(host.tcp) else [])
        ),
        process=True,
        hook=True,
    ),
    _attack(
        "find and disable the audit hook (gc, frames, ctypes.pythonapi)",
        """
import gc
def disable():
    for f in gc.get_objects():
        if callable(f) and getattr(f, "__name__", "") == "guard":
            f.__code__ = (lambda event, args: None).__code__
            return "disabled"
attempt("gc", disable)
attempt("pythonapi", lambda: ctypes.pythonapi._PySys_ClearAuditHooks())
attempt("write", lambda: open($target, "w").write("escaped"))
""",
        _nothing_outside,
        lambda out, host: (
            []
            if "sandbox: writing outside" in out and "disabled" not in str(report(out).get("gc"))
            else ["the hook was disabled"]
        ),
        process=True,
        hook=True,
    ),
    _attack(
        "change the host kernel's settings (/proc/sys, sysrq) as root outside the namespace",
        """
def flip(path):
    with open(path) as f:
        before = f.read().strip()
    report["before " + path] = before
    with open(path, "w") as f:
        f.write(str(1 - int(before) if before in ("0", "1") else 60))
    return "written"
for path in ("/proc/sys/kernel/core_uses_pid", "/proc/sys/vm/swappiness"):
    attempt(path, lambda: flip(path))
attempt("sysrq", lambda: open("/proc/sysrq-trigger", "w").write("h"))
attempt("uid_map", lambda: open("/proc/self/uid_map").read())
""",
        lambda out, host: _kernel_settings_changed(report(out)),
    ),
    _attack(
        "flood the output",
        """
sys.stdout.write("x" * 100_000_000)
""",
        lambda out, host: [] if len(out) <= 4096 + 64 else [f"{len(out)} bytes came back"],
        process=True,
    ),
    _attack(
        "burn CPU forever",
        """
while True:
    pass
""",
        lambda out, host: [] if out.startswith("Error: killed") else ["not killed"],
        process=True,
    ),
    _attack(
        "leave processes behind after the deadline",
        """
import threading, time
threading.Thread(target=time.sleep, args=(600,)).start()
try:
    if os.fork() == 0:
        os.setsid(); time.sleep(600)
except OSError:
    pass
print("lingering", flush=True)
""",
        # As a user (not root), the plain process's RLIMIT_NPROC counts all of that
        # user's processes, so its thread may be refused at once: contained too.
        lambda out, host: (
            []
            if "wall-clock" in out or "can't start new thread" in out
            else ["the deadline did not fire"]
        ),
        process=True,
    ),
]
