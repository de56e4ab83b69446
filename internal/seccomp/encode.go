package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// Encode lays a program out as struct sock_filter[] in this machine's byte
// order: what a process that does not compile its own filter loads (the
// zygote with prctl, a sandbox's init with Decode and Install).
func Encode(prog []unix.SockFilter) []byte {
	out := make([]byte, 0, 8*len(prog))
	for _, f := range prog {
		out = binary.NativeEndian.AppendUint16(out, f.Code)
		out = append(out, f.Jt, f.Jf)
		out = binary.NativeEndian.AppendUint32(out, f.K)
	}
	return out
}

// Decode is Encode's inverse.
func Decode(b []byte) ([]unix.SockFilter, error) {
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: a program of %d bytes", len(b))
	}
	prog := make([]unix.SockFilter, len(b)/8)
	for i := range prog {
		f := b[8*i:]
		prog[i] = unix.SockFilter{Code: binary.NativeEndian.Uint16(f), Jt: f[2], Jf: f[3], K: binary.NativeEndian.Uint32(f[4:])}
	}
	return prog, nil
}
