"""Tests of zygote.py's preparation before its first fork, run by
runner_test.go (TestZygotePython) with the host's python3: the warm-up
leaves nothing behind but warmer code, and the free blocks of the pools
the zygote's objects are in are taken."""

import builtins
import dis
import gc
import linecache
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import runner  # noqa: E402
import zygote  # noqa: E402

POOL = 16 << 10  # pymalloc's pool on 64-bit builds with its radix tree


def specialised(func):
    """The instructions of func that CPython has specialised."""
    plain = [i.opname for i in dis.get_instructions(func)]
    adaptive = [i.opname for i in dis.get_instructions(func, adaptive=True)]
    return [a for p, a in zip(plain, adaptive) if a != p]


class WarmUp(unittest.TestCase):
    @unittest.skipUnless(sys.version_info[:2] == (3, 11), "Python 3.11's quickening")
    def test_specialises_the_runner_and_leaves_nothing_behind(self):
        # A fresh interpreter has run none of the runner: nothing of it
        # specialised yet.
        self.assertEqual(specialised(runner.Runtime._run_python), [])
        main, fds = sys.modules["__main__"], sorted(os.listdir("/proc/self/fd"))
        zygote._warm_up()
        for func in (runner.Runtime.run_cell, runner.Runtime._run_python, runner.Channel.receive):
            self.assertNotEqual(specialised(func), [], func.__qualname__)
        self.assertIs(sys.modules["__main__"], main)
        self.assertNotIn("_vivarium_runtime", sys.modules)
        self.assertFalse(hasattr(builtins, "display"))
        self.assertNotIn("<warm-up>", linecache.cache)
        self.assertEqual(sorted(os.listdir("/proc/self/fd")), fds)


class FillPools(unittest.TestCase):
    def test_new_objects_go_to_new_pools(self):
        gc.collect()
        # Holes in pools that hold other objects, as gc.collect leaves
        # them in the zygote's.
        keep, holes = [], []
        for i in range(2000):
            (holes if i % 2 else keep).append(bytes(31))  # a 64-byte block
        old_pools = {id(b) // POOL for b in keep}
        del holes
        zygote._fill_pools()
        new = [bytes(31) for _ in range(200)]
        reused = [b for b in new if id(b) // POOL in old_pools]
        self.assertEqual(len(reused), 0, "%d of 200 new objects went into the old pools' holes" % len(reused))


if __name__ == "__main__":
    unittest.main()
