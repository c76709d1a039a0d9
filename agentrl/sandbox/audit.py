"""The PEP 578 audit hook the sandboxed program installs: an extra layer, never the boundary.

Part of the program inside the sandbox (:mod:`.inside`, step 5). Standard library only,
and no ``from __future__`` import: :func:`agentrl.sandbox.isolation.inside_source` puts
this source in place of inside's import of it, so that the sandbox runs one ``python -c``
script (agentrl itself is not importable there). The hook's state is closed over, not
kept in any module's globals, so rebinding names does not reach it.
"""

import os
import sys

PATH_EVENTS = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.truncate": 1,
    "os.utime": 1,
    "os.rename": 2,
    "os.link": 2,
    "os.symlink": 2,
}
REFUSED = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.kill",
        "os.killpg",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.call_function",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
    }
)
NETWORK_EVENTS = frozenset({"socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"})
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def install_audit_hook(workdir: str, network: bool) -> None:
    """Refuse writes outside ``workdir``, other processes' /proc, programs, fork, signals,
    ctypes, finding the hook through gc and (without network) sockets."""
    refused = REFUSED if network else REFUSED | NETWORK_EVENTS
    path_events, write_flags, own_proc = dict(PATH_EVENTS), WRITE_FLAGS, f"/proc/{os.getpid()}/"
    root, prefix = workdir, workdir.rstrip("/") + "/"
    realpath, fsdecode, fspath = os.path.realpath, os.fsdecode, os.fspath
    # Builtins too: a program that rebinds builtins.isinstance must not reach these.
    is_a, int_, str_, texts, denied = isinstance, int, str, (str, bytes), PermissionError
    write_modes = frozenset("wax+")

    def inside(path: object) -> bool:
        if is_a(path, int_):
            return True
        real = realpath(fsdecode(fspath(path)))  # type: ignore[arg-type]
        return real == root or real.startswith(prefix)

    def guard(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            if is_a(path, texts):
                name = realpath(fsdecode(path))
                other = name[6:7].isdigit() and not name.startswith(own_proc)
                if name.startswith("/proc/") and other:
                    raise denied(f"sandbox: reading other processes is not allowed: {name}")
            writes = not write_modes.isdisjoint(mode) if is_a(mode, str_) else flags & write_flags
            if writes and path is not None and not inside(path):
                raise denied(f"sandbox: writing outside the working directory: {path}")
        elif event in path_events:
            for path in args[: path_events[event]]:
                if path is not None and not inside(path):
                    raise denied(f"sandbox: {event} outside the working directory: {path}")
        elif event in refused:
            raise denied(f"sandbox: {event} is not allowed")

    sys.addaudithook(guard)
