//go:build linux

// Package seccomp builds and installs the system call filter that every
// sandboxed process runs under.
//
// The filter is a deny list compiled to classic BPF by this package (no
// libseccomp, no cgo). It is a second wall behind the namespaces: most of what
// it denies would already fail for an unprivileged user in a user namespace,
// but kernel bugs hide in exactly these calls (io_uring, bpf, userfaultfd,
// keyctl, new mount API), so the sandbox never reaches them at all.
//
// Only the low 32 bits of an argument are ever compared. That is sound for the
// arguments checked here because the kernel itself truncates them: ioctl's
// request, socket's domain and personality's persona are 32-bit, and legacy
// clone takes its namespace flags from lower_32_bits(flags).
package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Op says how an argument is compared.
type Op int

const (
	// OpMaskAny matches when arg & Value != 0.
	OpMaskAny Op = iota
	// OpIn matches when arg equals one of Values.
	OpIn
	// OpNotIn matches when arg equals none of Values.
	OpNotIn
)

// ArgCheck restricts a Rule to calls whose argument matches.
type ArgCheck struct {
	Arg    int // argument index, 0-5
	Op     Op
	Value  uint32   // for OpMaskAny
	Values []uint32 // for OpIn and OpNotIn
}

// Rule denies one system call, always or when its argument check matches.
type Rule struct {
	Name  string
	Nr    uint32
	Errno unix.Errno
	When  *ArgCheck // nil: deny every call
}

// Classic BPF opcodes used by the compiler (linux/filter.h).
const (
	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJgeK   = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	bpfJsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// Offsets into struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16 // args[i] at offArgs + 8*i; low word first on little-endian
)

const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
)

func retErrno(e unix.Errno) uint32 {
	return unix.SECCOMP_RET_ERRNO | (uint32(e) & unix.SECCOMP_RET_DATA)
}

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

// Compile turns rules into a BPF program for the architecture this binary was
// built for. The program, in order:
//  1. kills the process if the call is not of the native architecture (no
//     32-bit int 0x80 entry, no foreign ABI);
//  2. refuses x32 system calls (amd64 only) with ENOSYS;
//  3. for each rule, returns its errno when the number (and the argument
//     check) matches;
//  4. allows everything else.
func Compile(rules []Rule) ([]unix.SockFilter, error) {
	seen := make(map[uint32]string, len(rules))
	prog := []unix.SockFilter{
		stmt(bpfLdWAbs, offArch),
		jump(bpfJeqK, nativeArch, 1, 0),
		stmt(bpfRetK, retKill),
		stmt(bpfLdWAbs, offNr),
	}
	if x32SyscallBit != 0 {
		prog = append(prog,
			jump(bpfJgeK, x32SyscallBit, 0, 1),
			stmt(bpfRetK, retErrno(unix.ENOSYS)),
		)
	}
	for _, r := range rules {
		if prev, ok := seen[r.Nr]; ok {
			return nil, fmt.Errorf("seccomp: rules %q and %q name the same system call %d", prev, r.Name, r.Nr)
		}
		seen[r.Nr] = r.Name
		block, err := ruleBlock(r)
		if err != nil {
			return nil, err
		}
		if len(block) > 255 {
			return nil, fmt.Errorf("seccomp: rule %q compiles to %d instructions, more than a jump can skip", r.Name, len(block))
		}
		prog = append(prog, jump(bpfJeqK, r.Nr, 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	prog = append(prog, stmt(bpfRetK, retAllow))
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel accepts %d", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// ruleBlock is what runs once the system call number matched. Every path
// through it returns, so it never falls through into the next rule.
func ruleBlock(r Rule) ([]unix.SockFilter, error) {
	deny := stmt(bpfRetK, retErrno(r.Errno))
	allow := stmt(bpfRetK, retAllow)
	c := r.When
	if c == nil {
		return []unix.SockFilter{deny}, nil
	}
	if c.Arg < 0 || c.Arg > 5 {
		return nil, fmt.Errorf("seccomp: rule %q checks argument %d", r.Name, c.Arg)
	}
	block := []unix.SockFilter{stmt(bpfLdWAbs, uint32(offArgs+8*c.Arg))}
	switch c.Op {
	case OpMaskAny:
		block = append(block, jump(bpfJsetK, c.Value, 0, 1), deny, allow)
	case OpIn, OpNotIn:
		n := len(c.Values)
		if n == 0 || n > 100 {
			return nil, fmt.Errorf("seccomp: rule %q compares against %d values", r.Name, n)
		}
		// n comparisons, then two returns. A match jumps over the first
		// return to the second; no match falls through to the first.
		first, second := allow, deny // OpIn: a match denies
		if c.Op == OpNotIn {
			first, second = deny, allow
		}
		for i, v := range c.Values {
			block = append(block, jump(bpfJeqK, v, uint8(n-i), 0))
		}
		block = append(block, first, second)
	default:
		return nil, fmt.Errorf("seccomp: rule %q has unknown operator %d", r.Name, c.Op)
	}
	return block, nil
}
