"""Landlock (linux/landlock.h) for a runner forked from a zygote: its file
access confined beneath its own root. The zygote's child applies it before
it becomes the runner (zygote.py). CRIU does not save it: a restore gives
every restored thread a domain with the same rules again, in CRIU's
restorer (scripts/criu/landlock-restore.patch)."""

import ctypes
import os

# The same numbers on every architecture.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LandlockError(Exception):
    pass


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(step, rc):
    if rc != 0:
        raise LandlockError("%s: %s" % (step, os.strerror(ctypes.get_errno())))


def abi():
    """The kernel's Landlock ABI version, 0 where there is none."""
    return max(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION), 0)


def confine_to_root(abi):
    """Every file access right the ABI knows, granted beneath "/" alone."""
    rights = (1 << 13) - 1  # execute ... make_sym (ABI 1)
    if abi >= 2:
        rights |= 1 << 13  # refer
    if abi >= 3:
        rights |= 1 << 14  # truncate
    if abi >= 5:
        rights |= 1 << 15  # ioctl on devices
    attr = _RulesetAttr(rights)
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        _check("landlock ruleset", -1)
    try:
        # "/", and the sandbox's message queues, which mq_open reaches
        # through its IPC namespace's own mount of the same file system,
        # outside the root: a rule on /dev/mqueue names the same inode.
        for path in ("/", "/dev/mqueue"):
            try:
                fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                rule = _PathBeneathAttr(rights, fd)
                _check("landlock rule for " + path, _libc.syscall(
                    SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0))
            finally:
                os.close(fd)
        _check("landlock", _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0))
    finally:
        os.close(ruleset)
