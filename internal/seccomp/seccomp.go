//go:build linux

// Package seccomp builds and installs the system call filter that every
// sandboxed process runs under.
//
// The filter is an allowlist (policy_linux.go) compiled to classic BPF by
// this package (no libseccomp, no cgo). It is a second wall behind the
// namespaces: most of what it refuses would already fail for an
// unprivileged user in a user namespace, but kernel bugs hide in exactly
// these calls (io_uring, bpf, userfaultfd, keyctl, the new mount API, and
// whatever the next kernel adds), so the sandbox never reaches them at all.
//
// A policy is a list of rules, one per system call number. A call the
// policy names gets its rule's action (allowed, or refused with an errno);
// a number the policy does not name gets ENOSYS, the answer of a kernel
// that lacks the call, so that system calls newer than the policy are
// refused the way programs expect and fall back from. The policy names
// every system call it knows, refusing the unwanted ones with EPERM.
//
// Arguments are compared on their low 32 bits unless a condition says
// Wide. That is sound only where the kernel itself truncates the argument
// (an int or unsigned int parameter, or legacy clone's flags, which it takes
// as lower_32_bits); pointers and unsigned longs are compared whole.
package seccomp

import (
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
)

// Action is what the filter answers a call: a SECCOMP_RET_* value.
type Action uint32

// Allow runs the call.
const Allow Action = unix.SECCOMP_RET_ALLOW

// FakeSuccess returns 0 without running the call (SECCOMP_RET_ERRNO with
// errno 0, which the kernel turns into a return value of 0).
const FakeSuccess Action = unix.SECCOMP_RET_ERRNO

// killProcess answers a call from a foreign architecture.
const killProcess Action = unix.SECCOMP_RET_KILL_PROCESS

// Errno refuses the call with e.
func Errno(e unix.Errno) Action {
	return Action(unix.SECCOMP_RET_ERRNO | uint32(e)&unix.SECCOMP_RET_DATA)
}

func (a Action) String() string {
	switch {
	case a == Allow:
		return "allow"
	case a == killProcess:
		return "kill"
	case a == FakeSuccess:
		return "fake success"
	case a&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return unix.ErrnoName(unix.Errno(a & unix.SECCOMP_RET_DATA))
	}
	return fmt.Sprintf("action %#x", uint32(a))
}

// Op says how an argument is compared.
type Op int

const (
	// OpIn holds when the argument equals one of Values.
	OpIn Op = iota
	// OpNotIn holds when the argument equals none of Values.
	OpNotIn
	// OpMaskAny holds when the argument has any bit of Values[0] set.
	OpMaskAny
)

// Cond is one condition on an argument.
type Cond struct {
	Arg    int // 0-5
	Op     Op
	Values []uint64
	// Wide compares all 64 bits; otherwise the low 32 bits only (see the
	// package comment for when that is sound).
	Wide bool
}

// Case gives Action to the calls for which every condition holds.
type Case struct {
	When   []Cond
	Action Action
}

// Rule is the policy for one system call: the first of Cases that holds
// decides; when none does, or there are none, Action.
type Rule struct {
	Name   string
	Nr     uint32
	Cases  []Case
	Action Action
}

// Condition constructors, to keep the policy readable.
func argIn(i int, vs ...uint64) Cond    { return Cond{Arg: i, Op: OpIn, Values: vs} }
func argNotIn(i int, vs ...uint64) Cond { return Cond{Arg: i, Op: OpNotIn, Values: vs} }
func argAny(i int, mask uint64) Cond    { return Cond{Arg: i, Op: OpMaskAny, Values: []uint64{mask}} }

// wide returns c comparing all 64 bits.
func (c Cond) wide() Cond { c.Wide = true; return c }

// holds is the meaning of c, which the compiled program must reproduce.
func (c Cond) holds(args [6]uint64) bool {
	v := args[c.Arg]
	if !c.Wide {
		v &= 0xffffffff
	}
	switch c.Op {
	case OpMaskAny:
		return v&c.Values[0] != 0
	case OpIn, OpNotIn:
		in := false
		for _, w := range c.Values {
			in = in || v == w
		}
		return in == (c.Op == OpIn)
	}
	panic("seccomp: unknown operator")
}

// decide is the meaning of the rule for one call.
func (r Rule) decide(args [6]uint64) Action {
	for _, c := range r.Cases {
		all := true
		for _, cond := range c.When {
			all = all && cond.holds(args)
		}
		if all {
			return c.Action
		}
	}
	return r.Action
}

// evaluate is what a program compiled from rules answers a call of this
// binary's architecture: the plain statement of the policy, against which
// the tests check the compiled program.
func evaluate(rules []Rule, nr uint32, args [6]uint64) Action {
	for _, r := range rules {
		if r.Nr == nr {
			return r.decide(args)
		}
	}
	return Errno(unix.ENOSYS)
}

// Classic BPF opcodes used by the compiler (linux/filter.h).
const (
	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJa     = unix.BPF_JMP | unix.BPF_JA
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

// maxErrno is the largest errno a filter may return (MAX_ERRNO).
const maxErrno = 4095

// Compile turns rules into a BPF program for the architecture this binary
// was built for. The program:
//  1. kills the process if the call is not of the native architecture (no
//     32-bit int 0x80 entry, no foreign ABI);
//  2. finds the call's number by a binary search over ranges of numbers
//     that share an action (a few comparisons, where a chain of one
//     comparison per rule would make the last of ~350 calls pay ~350);
//  3. returns the range's action, or, for a call whose arguments are
//     checked, runs its rule's cases.
//
// Numbers above the highest the rules name, among them amd64's x32 system
// calls (nr | 0x40000000), get ENOSYS; so do the unnamed numbers below it.
// Paths that look only at the number and architecture end in a constant
// action, which lets the kernel cache allowed calls and skip the filter
// for them (its seccomp action cache, Linux 5.11).
func Compile(rules []Rule) ([]unix.SockFilter, error) {
	sorted, err := check(rules)
	if err != nil {
		return nil, err
	}
	a := &asm{ins: make([]insn, 0, 4*len(sorted))}
	wrongArch := a.newLabel()
	a.ld(offArch)
	a.jump(bpfJeqK, nativeArch, next, wrongArch)
	a.ld(offNr)
	a.tree(ranges(sorted))
	a.mark(wrongArch)
	a.ret(killProcess)
	prog, err := a.assemble()
	if err != nil {
		return nil, err
	}
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel accepts %d", len(prog), unix.BPF_MAXINSNS)
	}
	return prog, nil
}

// check validates rules and returns them sorted by number.
func check(rules []Rule) ([]Rule, error) {
	if len(rules) == 0 {
		return nil, fmt.Errorf("seccomp: no rules")
	}
	seen := make(map[uint32]string, len(rules))
	for _, r := range rules {
		if prev, ok := seen[r.Nr]; ok {
			return nil, fmt.Errorf("seccomp: rules %q and %q name the same system call %d", prev, r.Name, r.Nr)
		}
		seen[r.Nr] = r.Name
		if r.Nr >= 1<<12 {
			return nil, fmt.Errorf("seccomp: rule %q names system call %d, outside the native table", r.Name, r.Nr)
		}
		actions := []Action{r.Action}
		for _, c := range r.Cases {
			if len(c.When) == 0 {
				return nil, fmt.Errorf("seccomp: rule %q has a case without conditions", r.Name)
			}
			for _, cond := range c.When {
				if err := checkCond(cond); err != nil {
					return nil, fmt.Errorf("seccomp: rule %q: %w", r.Name, err)
				}
			}
			actions = append(actions, c.Action)
		}
		for _, act := range actions {
			isErrno := act&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO && act&unix.SECCOMP_RET_DATA <= maxErrno
			if act != Allow && !isErrno {
				return nil, fmt.Errorf("seccomp: rule %q: action %#x is neither allow nor an errno", r.Name, uint32(act))
			}
		}
	}
	sorted := append([]Rule(nil), rules...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Nr < sorted[j].Nr })
	return sorted, nil
}

func checkCond(c Cond) error {
	switch {
	case c.Arg < 0 || c.Arg > 5:
		return fmt.Errorf("argument %d", c.Arg)
	case c.Op == OpMaskAny && (len(c.Values) != 1 || c.Values[0] == 0):
		return fmt.Errorf("a mask condition needs one non-zero mask")
	case (c.Op == OpIn || c.Op == OpNotIn) && (len(c.Values) == 0 || len(c.Values) > 64):
		return fmt.Errorf("compares against %d values", len(c.Values))
	case c.Op != OpIn && c.Op != OpNotIn && c.Op != OpMaskAny:
		return fmt.Errorf("unknown operator %d", c.Op)
	}
	if !c.Wide {
		for _, v := range c.Values {
			if v > 0xffffffff {
				return fmt.Errorf("value %#x does not fit the 32 bits compared", v)
			}
		}
	}
	return nil
}

// span is a range of system call numbers [lo, hi] with one outcome: an
// action, or the rule whose arguments decide (for one number).
type span struct {
	lo, hi uint32
	action Action
	rule   *Rule
}

// ranges covers every number from 0 to 2^32-1 with spans, sorted, adjacent
// numbers of the same constant action merged.
func ranges(sorted []Rule) []span {
	enosys := Errno(unix.ENOSYS)
	var out []span
	add := func(s span) {
		if n := len(out); n > 0 && s.rule == nil && out[n-1].rule == nil && out[n-1].action == s.action && out[n-1].hi+1 == s.lo {
			out[n-1].hi = s.hi
			return
		}
		out = append(out, s)
	}
	from := uint32(0) // the first number not yet covered
	for i := range sorted {
		r := &sorted[i]
		if r.Nr > from {
			add(span{lo: from, hi: r.Nr - 1, action: enosys})
		}
		if len(r.Cases) == 0 {
			add(span{lo: r.Nr, hi: r.Nr, action: r.Action})
		} else {
			add(span{lo: r.Nr, hi: r.Nr, rule: r})
		}
		from = r.Nr + 1
	}
	add(span{lo: from, hi: ^uint32(0), action: enosys})
	return out
}

// tree emits a binary search over spans, the number in the accumulator.
// Each comparison halves the spans left; a leaf returns, or runs its
// rule's cases (which load arguments, so nothing after may rely on the
// number still being in the accumulator: every path through a leaf ends
// in a return).
func (a *asm) tree(spans []span) {
	if len(spans) == 1 {
		s := spans[0]
		if s.rule == nil {
			a.ret(s.action)
		} else {
			a.rule(s.rule)
		}
		return
	}
	mid := len(spans) / 2
	right := a.newLabel()
	a.jump(bpfJgeK, spans[mid].lo, right, next)
	a.tree(spans[:mid])
	a.mark(right)
	a.tree(spans[mid:])
}

// rule emits a rule's cases in order, then its default action.
func (a *asm) rule(r *Rule) {
	for _, c := range r.Cases {
		fail := a.newLabel()
		for _, cond := range c.When {
			a.cond(cond, fail)
		}
		a.ret(c.Action)
		a.mark(fail)
	}
	a.ret(r.Action)
}

// cond emits code that falls through when c holds and jumps to fail when
// it does not.
func (a *asm) cond(c Cond, fail label) {
	lo, hi := uint32(offArgs+8*c.Arg), uint32(offArgs+8*c.Arg+4)
	ok := a.newLabel()
	switch {
	case !c.Wide && c.Op == OpMaskAny:
		a.ld(lo)
		a.jump(bpfJsetK, uint32(c.Values[0]), next, fail)
	case !c.Wide && c.Op == OpIn:
		a.ld(lo)
		for i, v := range c.Values {
			miss := next
			if i == len(c.Values)-1 {
				miss = fail
			}
			a.jump(bpfJeqK, uint32(v), ok, miss)
		}
	case !c.Wide && c.Op == OpNotIn:
		a.ld(lo)
		for _, v := range c.Values {
			a.jump(bpfJeqK, uint32(v), fail, next)
		}
	case c.Op == OpMaskAny:
		m := c.Values[0]
		if uint32(m) != 0 {
			a.ld(lo)
			a.jump(bpfJsetK, uint32(m), ok, next)
		}
		if m>>32 != 0 {
			a.ld(hi)
			a.jump(bpfJsetK, uint32(m>>32), ok, next)
		}
		a.jumpAlways(fail)
	default: // wide OpIn, OpNotIn: the high word, then the low word, of each value
		match := ok
		if c.Op == OpNotIn {
			match = fail
		}
		for _, v := range c.Values {
			other := a.newLabel()
			a.ld(hi)
			a.jump(bpfJeqK, uint32(v>>32), next, other)
			a.ld(lo)
			a.jump(bpfJeqK, uint32(v), match, other)
			a.mark(other)
		}
		if c.Op == OpIn {
			a.jumpAlways(fail)
		}
	}
	a.mark(ok)
}
