"""The program that runs inside the sandbox: it seals its own process, then runs the
model's code.

The parent starts ``python -I -S -B -c <this file's source> <spec>`` (inside
bubblewrap, inside ``unshare``, or as a plain child process) and writes the model's
program to its stdin. Standard library only: agentrl itself is not visible inside.
In order:

1. ``unshare``: build the new root in the private mount namespace (read-only binds of
   the system, a size- and inode-limited tmpfs as the working directory, a fresh
   ``/proc`` of the new PID namespace, five device nodes), move it onto ``/`` and
   chroot into it, then become uid 65534 in a nested user namespace and drop every
   capability; the program runs in a child of this init. ``bwrap`` has done all
   that, but its tmpfs has no inode limit: mount one that has over the working
   directory, from a nested user and mount namespace.
2. Read the program, put ``/dev/null`` on stdin, write the program to ``main.py``.
3. rlimits, soft equal to hard: CPU, address space, file size, open files, processes,
   no core dumps.
4. ``no_new_privs`` and a seccomp filter (x86-64 and arm64) that cannot be removed:
   no new programs (execve), no new processes (threads only), no ptrace or access to
   other processes' memory, signals only to itself, no mount, namespace, keyring,
   bpf, perf or io_uring calls, no raising an rlimit, and no sockets unless the
   policy allows network.
5. The PEP 578 audit hook (:mod:`.audit`), if asked: an extra layer, never the boundary.
   Its state is closed over, not kept in any module's globals, so rebinding names does
   not reach it.
6. Run the program as ``__main__`` in fresh globals; a traceback shows its frames only.
"""

from __future__ import annotations

import ctypes
import marshal
import os
import resource
import sys

# One script runs in the sandbox: isolation.inside_source() puts audit.py's source here.
from agentrl.sandbox.audit import install_audit_hook

# ---------------------------------------------------------------------------------
# 1. The new root (the ``unshare`` mechanism)

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE, MS_REC = 1024, 2048, 4096, 8192, 16384
MS_RELATIME = 1 << 21
# Flags a bind mount in a user namespace must keep (the kernel locks them).
LOCKED_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
NOBODY = 65534

_LIBC: list[ctypes.CDLL] = []  # loaded on first use: importing this module does nothing


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _call(what: str, result: int) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sandbox setup: {what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    result = _libc().mount(encode(source), target.encode(), encode(fstype), flags, encode(data))
    _call(f"mount {source} on {target}", result)


def _remount_readonly(target: str) -> None:
    """Make ``target`` and every mount below it read-only, keeping the locked flags."""
    with open("/proc/self/mountinfo") as table:
        points = [_unescape(line.split()[4]) for line in table]
    for point in points:
        if point == target or point.startswith(target.rstrip("/") + "/"):
            keep = [ms for st, ms in LOCKED_FLAGS.items() if os.statvfs(point).f_flag & st]
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | sum(keep)
            _mount(None, point, None, flags)


def _unescape(field: str) -> str:
    """A path of /proc/self/mountinfo, where space, tab, newline and backslash are octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _bind_readonly(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    _remount_readonly(target)


def mount_workdir(workdir: str, disk: dict, owner: int) -> None:
    """The working directory: a tmpfs of ``disk["bytes"]`` bytes and ``disk["files"]``
    inodes (many empty files cost kernel memory, not bytes), owned by ``owner``."""
    options = f"size={disk['bytes']},nr_inodes={disk['files']},mode=0700,uid={owner},gid={owner}"
    _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, options)


def enter_new_root(root: dict, workdir: str, disk: dict, uid: int | None) -> None:
    """Build the sandbox's file system at ``root["mountpoint"]`` and switch into it.

    Runs as root of a new user namespace, in new mount and PID namespaces (``unshare
    --user --map-root-user --mount --pid --fork``); mount propagation is private. When
    agentrl runs as root (``uid`` set), there is no user namespace yet: it builds the
    root as real root, then becomes that uid on the host before it enters one (uid 65534
    of a namespace made by root would be root outside).
    """
    new = root["mountpoint"]
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=0755")
    for path in root["binds"]:
        _bind_readonly(path, new + path)
    for path, target in root["symlinks"]:
        os.makedirs(os.path.dirname(new + path), exist_ok=True)
        os.symlink(target, new + path)
    for device in root["devices"]:  # the host's /dev mount keeps its flags: nodev off
        os.makedirs(new + "/dev", exist_ok=True)
        open(new + device, "a").close()
        _mount(device, new + device, None, MS_BIND)
    os.makedirs(new + workdir)
    mount_workdir(new + workdir, disk, owner=0 if uid is None else uid)
    os.makedirs(new + "/proc")
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for part in ("/proc/sys", "/proc/sysrq-trigger"):  # kernel settings: read-only
        if os.path.exists(new + part):
            _bind_readonly(new + part, new + part)
    os.chdir(new)
    _mount(new, "/", None, MS_MOVE)
    os.chroot(".")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(workdir)
    if uid is not None:
        _become_host_user(uid)
    _enter_user_namespace(NOBODY, 0 if uid is None else uid, CLONE_NEWUSER)


def _become_host_user(uid: int) -> None:
    """From real root: empty the capability bounding set, then become ``uid`` (and gid)
    with no supplementary groups; the kernel clears every capability on that change.
    The caller then enters a user namespace as that uid (inner 65534)."""
    _drop_bounding_set()
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # The change made the process undumpable, which makes /proc/self root's: writing
    # its uid_map would then fail. No core dumps either way (RLIMIT_CORE 0).
    _call("prctl(PR_SET_DUMPABLE)", _libc().prctl(4, 1, 0, 0, 0))


def run_below_init() -> None:
    """Continue in a child; this process, the new PID namespace's init, waits for it and
    exits with its status (a signal N as 128 + N, as bubblewrap reports it). The kernel
    does not deliver default-action signals to an init, RLIMIT_CPU's included."""
    child = os.fork()
    if child == 0:
        return
    while True:
        pid, status = os.wait()
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def limit_bwrap_workdir(workdir: str, disk: dict, uid: int | None) -> None:
    """bubblewrap's tmpfs has a size but no inode limit: mount one that has both over
    it, from a nested user and mount namespace (its capabilities reach only that
    namespace's own mounts, and are dropped right after). As root (``uid`` set), bwrap
    made no user namespace: become that uid on the host first."""
    if uid is not None:
        _become_host_user(uid)
    _enter_user_namespace(NOBODY, os.getuid(), CLONE_NEWUSER | CLONE_NEWNS, drop=False)
    mount_workdir(workdir, disk, owner=NOBODY)
    os.chdir(workdir)
    _drop_capabilities()


def _enter_user_namespace(inner: int, outer: int, flags: int, drop: bool = True) -> None:
    """Become uid and gid ``inner`` of a new user namespace where that is ``outer`` of
    this one; unless ``drop`` is False, with no capabilities left in any namespace."""
    _call(f"unshare({flags:#x})", _libc().unshare(flags))
    for name, line in (
        ("setgroups", "deny"),
        ("uid_map", f"{inner} {outer} 1"),
        ("gid_map", f"{inner} {outer} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(line)
    if drop:
        _drop_capabilities()


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]


def _drop_bounding_set() -> None:
    pr_capbset_drop, pr_cap_ambient, ambient_clear_all = 24, 47, 4
    for cap in range(64):
        if _libc().prctl(pr_capbset_drop, cap, 0, 0, 0) != 0:
            break  # EINVAL: past the last capability this kernel knows
    _libc().prctl(pr_cap_ambient, ambient_clear_all, 0, 0, 0)


def _drop_capabilities() -> None:
    _drop_bounding_set()
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    _call("capset", _libc().capset(ctypes.byref(header), (_CapData * 2)()))


def _check_sealed() -> None:
    """Refuse to run the program if the OS layer is not what the parent asked for."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    if int(status["CapEff"], 16) or int(status["CapBnd"], 16) or os.getuid() != NOBODY:
        raise SystemExit(f"sandbox setup: still privileged (uid {os.getuid()}): refusing")


# ---------------------------------------------------------------------------------
# 3. rlimits


def set_limits(limits: dict) -> None:
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["max_file_bytes"]),
        ("RLIMIT_NOFILE", limits["max_open_files"]),
        ("RLIMIT_NPROC", limits["max_processes"]),
        ("RLIMIT_CORE", 0),
    ):
        kind = getattr(resource, name)
        soft = hard = value
        if name == "RLIMIT_CPU":  # SIGXCPU at the limit, SIGKILL a second later
            hard = value + 1
        current = resource.getrlimit(kind)[1]
        if current != resource.RLIM_INFINITY:  # a lower limit set for this user stays
            hard = min(hard, current)
            soft = min(soft, hard)
        resource.setrlimit(kind, (soft, hard))


# ---------------------------------------------------------------------------------
# 4. seccomp

# syscall: (x86-64 number, arm64 number); None where the architecture has no such call
SYSCALLS: dict[str, tuple[int | None, int | None]] = {
    "execve": (59, 221),
    "execveat": (322, 281),
    "fork": (57, None),
    "vfork": (58, None),
    "clone": (56, 220),
    "clone3": (435, 435),
    "kill": (62, 129),
    "tkill": (200, 130),
    "tgkill": (234, 131),
    "rt_sigqueueinfo": (129, 138),
    "rt_tgsigqueueinfo": (297, 240),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "process_madvise": (440, 440),
    "pidfd_open": (434, 434),
    "pidfd_send_signal": (424, 424),
    "pidfd_getfd": (438, 438),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "unshare": (272, 97),
    "setns": (308, 268),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "setrlimit": (160, 164),
    "prlimit64": (302, 261),
    "quotactl": (179, 60),
    "acct": (163, 89),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "syslog": (103, 116),
    "socket": (41, 198),
}
DENIED = tuple(
    name
    for name in SYSCALLS
    if name
    not in {
        "clone",
        "clone3",
        "kill",
        "tgkill",
        "rt_sigqueueinfo",
        "rt_tgsigqueueinfo",
        "prlimit64",
        "socket",
    }
)
SELF_SIGNALS = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}  # AUDIT_ARCH_*, column
CLONE_THREAD, CLONE_NAMESPACES = 0x00010000, 0x7E020000
EPERM, ENOSYS = 1, 38
_LD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH, _ARG0, _ARG2, _ARG2_HIGH = 0, 4, 16, 32, 36  # offsets in struct seccomp_data


def seccomp_program(
    machine: str, pid: int, network: bool
) -> list[tuple[int, int, int, int]] | None:
    """The filter as (code, jt, jf, k) rows; None on an architecture without a table."""
    if machine not in ARCHES:
        return None
    arch, column = ARCHES[machine]
    nr = {name: numbers[column] for name, numbers in SYSCALLS.items()}
    deny = (_RET, 0, 0, _ERRNO | EPERM)
    prog = [(_LD, 0, 0, _ARCH), (_JEQ, 1, 0, arch), (_RET, 0, 0, _KILL), (_LD, 0, 0, _NR)]
    if machine == "x86_64":  # the x32 ABI's numbers
        prog += [(_JGE, 0, 1, 0x40000000), deny]
    for name in (*DENIED, *(() if network else ("socket",))):
        if nr[name] is not None:
            prog += [(_JEQ, 0, 1, nr[name]), deny]
    prog += [(_JEQ, 0, 1, nr["clone3"]), (_RET, 0, 0, _ERRNO | ENOSYS)]  # libc falls back
    prog += [
        (_JEQ, 0, 5, nr["clone"]),
        (_LD, 0, 0, _ARG0),
        (_JSET, 2, 0, CLONE_NAMESPACES),
        (_JSET, 0, 1, CLONE_THREAD),
        (_RET, 0, 0, _ALLOW),
        deny,
    ]
    for name in SELF_SIGNALS:
        prog += [
            (_JEQ, 0, 4, nr[name]),
            (_LD, 0, 0, _ARG0),
            (_JEQ, 0, 1, pid),
            (_RET, 0, 0, _ALLOW),
            deny,
        ]
    prog += [
        (_JEQ, 0, 6, nr["prlimit64"]),
        (_LD, 0, 0, _ARG2),
        (_JEQ, 0, 3, 0),
        (_LD, 0, 0, _ARG2_HIGH),
        (_JEQ, 0, 1, 0),
        (_RET, 0, 0, _ALLOW),
        deny,
    ]
    return [*prog, (_RET, 0, 0, _ALLOW)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install_seccomp(network: bool) -> bool:
    """Load the filter into this process; False where the architecture has no table."""
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    _call("no_new_privs", _libc().prctl(pr_set_no_new_privs, 1, 0, 0, 0))
    rows = seccomp_program(os.uname().machine, os.getpid(), network)
    if rows is None:
        return False
    table = (_SockFilter * len(rows))(*(_SockFilter(*row) for row in rows))
    prog = _SockFprog(len(rows), table)
    _call("seccomp", _libc().prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0))
    return True


# ---------------------------------------------------------------------------------
# 2 and 6. The program


def read_program() -> str:
    source = sys.stdin.buffer.read().decode("utf-8", errors="replace")
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    with open("main.py", "w") as f:  # for tracebacks with source lines, as a script has
        f.write(source)
    return source


def run_program(source: str, paths: list[str]) -> None:
    """Run ``source`` as ``__main__`` the way ``python main.py`` would, with the
    interpreter's site-packages (``paths``) importable but their ``.pth`` hooks not run."""
    import builtins

    path = os.path.join(os.getcwd(), "main.py")
    module = type(sys)("__main__")
    module.__dict__.update(__file__=path, __builtins__=builtins)
    sys.modules["__main__"], sys.argv = module, [path]
    sys.path[0:0], sys.path[len(sys.path) :] = [os.getcwd()], paths
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        import traceback  # only now: it costs a tenth of the start-up

        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        traceback.print_exception(type(e), e, tb)
        sys.stderr.flush()
        raise SystemExit(1) from None


def main(argv: list[str]) -> None:
    # The spec comes from the parent, the same interpreter: marshal costs no import
    # (json would pull in re, a tenth of the start-up of a trivial program).
    spec = marshal.loads(bytes.fromhex(argv[1]))
    if spec["mechanism"] == "unshare":
        enter_new_root(spec["root"], spec["workdir"], spec["disk"], spec["host_uid"])
        run_below_init()
    elif spec["mechanism"] == "bwrap":
        limit_bwrap_workdir(spec["workdir"], spec["disk"], spec["host_uid"])
    if spec["mechanism"] != "process":
        _check_sealed()
    source = read_program()
    set_limits(spec["limits"])
    install_seccomp(spec["network"])
    if spec["audit_hook"]:
        install_audit_hook(os.path.realpath(os.getcwd()), spec["network"])
    run_program(source, spec["paths"])


if __name__ == "__main__":
    main(sys.argv)
