package testutil

// LandlockLayersPython is Python code, for a sandbox's runner or a program
// of its own (it imports nothing of the runner's), that defines
// landlock_layers(): the number of Landlock domains the calling thread is
// in. A child of it stacks empty domains until the kernel's limit of 16
// refuses; 0 where the kernel has no Landlock.
const LandlockLayersPython = `def landlock_layers():
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        n, attr = 0, ctypes.c_uint64(1)
        while n < 20:
            fd = libc.syscall(444, ctypes.byref(attr), 8, 0)
            if fd < 0:
                break
            rc = libc.syscall(446, ctypes.c_long(fd), 0)
            os.close(fd)
            if rc != 0:
                break
            n += 1
        os.write(w, str(n).encode())
        os._exit(0)
    os.close(w)
    n = int(os.read(r, 16) or b'0')
    os.close(r)
    os.waitpid(pid, 0)
    return 16 - n if n else 0
`
