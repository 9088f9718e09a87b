"""The seccomp filter every bubblewrap box runs under: no whiteouts, no device nodes.

Since Linux 5.8 any user may make an overlayfs *whiteout* — ``mknod(path, S_IFCHR, 0)``
or ``renameat2(…, RENAME_WHITEOUT)`` — without ``CAP_MKNOD``. On an overlay-mounted
workspace overlayfs refuses it, but a copied workspace (the copy fallback) is a plain
folder: a box could leave a whiteout there, which the freeze seals as a whiteout entry
and every workspace stacked on the layer then reads as a deletion. The filter answers
``EPERM`` to ``mknod``/``mknodat`` of a character or block device (FIFOs, sockets and
regular files stay allowed), to ``renameat2`` with ``RENAME_WHITEOUT``, and to
``io_uring_setup`` (an io_uring rename carries the same flag past seccomp); on x86-64
also to every x32 and 32-bit system call, whose numbers the filter does not check.

bubblewrap loads it (``--seccomp FD``) after setting ``no_new_privs``, just before it
runs the launcher, so it binds the launcher and everything it starts. A classic BPF
program, assembled here for the host's architecture (x86-64, aarch64); elsewhere
:func:`filter_program` returns None and boxes run without it.
"""

from __future__ import annotations

import errno
import platform
import stat
import struct

# classic BPF opcodes
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_AND = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET = 0x06  # BPF_RET | BPF_K

_ALLOW = 0x7FFF0000  # SECCOMP_RET_ALLOW
_DENY = 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO | EPERM

# struct seccomp_data: nr, arch, instruction_pointer, args[6] (64-bit, little-endian)
_NR, _ARCH = 0, 4


def _arg(index: int) -> int:
    return 16 + 8 * index  # the low 32 bits of args[index]


_RENAME_WHITEOUT = 1 << 2
_S_IFMT = 0o170000  # the file-type bits of a mode (``stat.S_IFMT`` is a function)
_X32_SYSCALL_BIT = 0x40000000


class _Arch:
    def __init__(
        self,
        audit: int,
        mknod: int | None,
        mknodat: int,
        renameat2: int,
        io_uring_setup: int,
        x32: bool,
    ) -> None:
        self.audit, self.mknod, self.mknodat = audit, mknod, mknodat
        self.renameat2, self.io_uring_setup, self.x32 = renameat2, io_uring_setup, x32


_ARCHES = {
    "x86_64": _Arch(0xC000003E, 133, 259, 316, 425, x32=True),
    "aarch64": _Arch(0xC00000B7, None, 33, 276, 425, x32=False),
}


def _assemble(lines: list[tuple[str, int, str, str] | str]) -> bytes:
    """``(op, k, jump_if_true, jump_if_false)`` lines, or ``"label:"`` lines; a jump names
    a label (``""``: the next instruction)."""
    labels: dict[str, int] = {}
    code: list[tuple[str, int, str, str]] = []
    for line in lines:
        if isinstance(line, str):
            labels[line.rstrip(":")] = len(code)
        else:
            code.append(line)
    ops = {"ld": _LD_ABS, "jeq": _JEQ, "jge": _JGE, "jset": _JSET, "and": _AND, "ret": _RET}
    out = bytearray()
    for pc, (op, k, jt, jf) in enumerate(code):

        def rel(label: str, pc: int = pc) -> int:
            return 0 if not label else labels[label] - pc - 1

        out += struct.pack("=HBBI", ops[op], rel(jt), rel(jf), k)
    return bytes(out)


def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this host's), or None where it is not known."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    lines: list[tuple[str, int, str, str] | str] = [
        ("ld", _ARCH, "", ""),
        ("jeq", arch.audit, "native", "deny"),  # a foreign ABI (int 0x80): nothing at all
        "native:",
        ("ld", _NR, "", ""),
    ]
    if arch.x32:
        lines.append(("jge", _X32_SYSCALL_BIT, "deny", ""))
    if arch.mknod is not None:
        lines.append(("jeq", arch.mknod, "mode_in_arg1", ""))
    lines += [
        ("jeq", arch.mknodat, "mode_in_arg2", ""),
        ("jeq", arch.renameat2, "rename_flags", ""),
        ("jeq", arch.io_uring_setup, "deny", ""),
        ("ret", _ALLOW, "", ""),
        "mode_in_arg1:",
        ("ld", _arg(1), "", ""),
        ("jset", 0, "", "mode"),  # always false: on to the mode check
        "mode_in_arg2:",
        ("ld", _arg(2), "", ""),
        "mode:",
        ("and", _S_IFMT, "", ""),
        ("jeq", stat.S_IFCHR, "deny", ""),
        ("jeq", stat.S_IFBLK, "deny", ""),
        ("ret", _ALLOW, "", ""),
        "rename_flags:",
        ("ld", _arg(4), "", ""),
        ("jset", _RENAME_WHITEOUT, "deny", ""),
        ("ret", _ALLOW, "", ""),
        "deny:",
        ("ret", _DENY, "", ""),
    ]
    return _assemble(lines)
