"""The runner's entry point where a sandbox starts an interpreter of its
own (not forked from a zygote): the runner is imported, not run as a
script, so that its bytecode compiled beforehand by the host's
interpreter (__pycache__, Bytecode in runner.go) is loaded where this
interpreter is of the same version, instead of compiling the runner at
every start; another version compiles it from source, as before."""

import runner

runner.exit_now(runner.main())
