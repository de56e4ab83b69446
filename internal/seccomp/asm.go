//go:build linux

package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// label names a position in a program being assembled; next (0) is the
// instruction that follows.
type label int

const next label = 0

// insn is an instruction with symbolic jump targets, or (mark != 0) the
// position of a label.
type insn struct {
	code   uint16
	k      uint32
	jt, jf label // conditional jumps; an unconditional jump's target is jt
	mark   label
}

// asm assembles a program whose jumps name labels, all forward, as
// classic BPF requires.
type asm struct {
	ins    []insn
	labels int
}

func (a *asm) newLabel() label {
	a.labels++
	return label(a.labels)
}

func (a *asm) mark(l label)       { a.ins = append(a.ins, insn{mark: l}) }
func (a *asm) ld(off uint32)      { a.ins = append(a.ins, insn{code: bpfLdWAbs, k: off}) }
func (a *asm) ret(act Action)     { a.ins = append(a.ins, insn{code: bpfRetK, k: uint32(act)}) }
func (a *asm) jumpAlways(l label) { a.ins = append(a.ins, insn{code: bpfJa, jt: l}) }

func (a *asm) jump(code uint16, k uint32, jt, jf label) {
	a.ins = append(a.ins, insn{code: code, k: k, jt: jt, jf: jf})
}

func isCond(code uint16) bool {
	return code&0x07 == unix.BPF_JMP && code != bpfJa
}

// assemble resolves labels. A conditional jump reaches at most 255
// instructions ahead; one that must go further is sent to an unconditional
// jump (32-bit offset) placed right after it: a trampoline.
func (a *asm) assemble() ([]unix.SockFilter, error) {
	for {
		l := a.layout()
		far := -1
		for i, in := range a.ins {
			if in.mark == 0 && isCond(in.code) && (l.dist(i, in.jt) > 255 || l.dist(i, in.jf) > 255) {
				far = i
				break
			}
		}
		if far < 0 {
			return a.emit(l)
		}
		a.trampoline(far, l)
	}
}

// layout is where each instruction and label of a program being assembled
// falls in the final program.
type layout struct {
	at      []int // by index into asm.ins; -1 for a label
	labelAt []int // by label; a label is at the instruction that follows it
	n       int   // the program's length
}

func (a *asm) layout() layout {
	l := layout{at: make([]int, len(a.ins)), labelAt: make([]int, a.labels+1)}
	for i, in := range a.ins {
		if in.mark != 0 {
			l.at[i] = -1
			l.labelAt[in.mark] = l.n
			continue
		}
		l.at[i] = l.n
		l.n++
	}
	return l
}

// dist is how many instructions a jump at a.ins[i] to t skips.
func (l layout) dist(i int, t label) int {
	if t == next {
		return 0
	}
	return l.labelAt[t] - l.at[i] - 1
}

// trampoline rewrites the conditional jump at a.ins[i], whose targets are
// too far, to jump to unconditional jumps placed right after it.
func (a *asm) trampoline(i int, l layout) {
	in := a.ins[i]
	after := a.newLabel() // what followed the jump
	if in.jt == next {
		in.jt = after
	}
	if in.jf == next {
		in.jf = after
	}
	var tramps []insn
	for _, t := range []*label{&in.jt, &in.jf} {
		if *t != after && l.dist(i, *t) > 255 {
			tl := a.newLabel()
			tramps = append(tramps, insn{mark: tl}, insn{code: bpfJa, jt: *t})
			*t = tl
		}
	}
	tramps = append(tramps, insn{mark: after})
	rest := append(tramps, a.ins[i+1:]...)
	a.ins = append(append(a.ins[:i:i], in), rest...)
}

func (a *asm) emit(l layout) ([]unix.SockFilter, error) {
	prog := make([]unix.SockFilter, 0, l.n)
	for i, in := range a.ins {
		if in.mark != 0 {
			continue
		}
		f := unix.SockFilter{Code: in.code, K: in.k}
		switch {
		case in.code == bpfJa:
			d := l.dist(i, in.jt)
			if d < 0 {
				return nil, fmt.Errorf("seccomp: backward jump at %d", l.at[i])
			}
			f.K = uint32(d)
		case isCond(in.code):
			dt, df := l.dist(i, in.jt), l.dist(i, in.jf)
			if dt < 0 || df < 0 || dt > 255 || df > 255 {
				return nil, fmt.Errorf("seccomp: jump at %d out of range (%d, %d)", l.at[i], dt, df)
			}
			f.Jt, f.Jf = uint8(dt), uint8(df)
		}
		prog = append(prog, f)
	}
	return prog, nil
}
