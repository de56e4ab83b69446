package bench

import "errors"

var (
	// ErrOutput: an iteration ran but did not print what its workload
	// prints, so its time says nothing about the workload.
	ErrOutput = errors.New("unexpected output")
	// ErrStatus: a Vivarium execution ended with a status other than ok.
	ErrStatus = errors.New("execution did not succeed")
)
