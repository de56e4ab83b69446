package wasm

import (
	"context"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// WASI's clocks (wasip1 clockid): wazero answers the first two and EINVAL
// for the CPU-time clocks, and CPython's time.process_time() then read
// nonsense (22 million seconds for a three-second loop). Here they are the
// instance's busy time: since its start, less its sleeps and its waits for
// requests, the time its CPU limit counts.
const (
	clockRealtime = iota
	clockMonotonic
	clockProcessCPU
	clockThreadCPU
)

// WASI errno values.
const (
	errnoSuccess = 0
	errnoFault   = 21
	errnoInval   = 28
)

// monotonicEpoch is where the guests' monotonic clock starts (the host's
// monotonic clock, as wazero's WithSysNanotime reads it).
var monotonicEpoch = time.Now()

type instanceKey struct{}

// withInstance is ctx carrying inst, for the host functions the guest
// calls while it runs under ctx.
func withInstance(ctx context.Context, inst *instance) context.Context {
	return context.WithValue(ctx, instanceKey{}, inst)
}

// instantiateWASI instantiates WASI preview 1 in rt, with the CPU-time
// clocks answered.
func instantiateWASI(ctx context.Context, rt wazero.Runtime) error {
	b := rt.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(b)
	i32, i64 := api.ValueTypeI32, api.ValueTypeI64
	// Exported again under the same names, they replace wazero's.
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(clockTimeGet), []api.ValueType{i32, i64, i32},
		[]api.ValueType{i32}).WithParameterNames("id", "precision", "result.timestamp").Export("clock_time_get")
	b.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(clockResGet), []api.ValueType{i32, i32},
		[]api.ValueType{i32}).WithParameterNames("id", "result.resolution").Export("clock_res_get")
	_, err := b.Instantiate(ctx)
	return err
}

func clockTimeGet(ctx context.Context, mod api.Module, stack []uint64) {
	var ns int64
	switch uint32(stack[0]) {
	case clockRealtime:
		ns = time.Now().UnixNano()
	case clockMonotonic:
		ns = int64(time.Since(monotonicEpoch))
	case clockProcessCPU, clockThreadCPU:
		inst, _ := ctx.Value(instanceKey{}).(*instance)
		if inst == nil {
			stack[0] = errnoInval
			return
		}
		ns = int64(inst.busy())
	default:
		stack[0] = errnoInval
		return
	}
	stack[0] = writeU64(mod, uint32(stack[2]), uint64(ns))
}

func clockResGet(_ context.Context, mod api.Module, stack []uint64) {
	var res uint64
	switch uint32(stack[0]) {
	case clockRealtime, clockMonotonic, clockProcessCPU, clockThreadCPU:
		res = 1000 // a microsecond, as wazero reports its own
	default:
		stack[0] = errnoInval
		return
	}
	stack[0] = writeU64(mod, uint32(stack[1]), res)
}

func writeU64(mod api.Module, at uint32, v uint64) uint64 {
	if !mod.Memory().WriteUint64Le(at, v) {
		return errnoFault
	}
	return errnoSuccess
}
