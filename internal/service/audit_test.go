package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/store"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	os.Exit(m.Run())
}

// heldAudit is an audit log whose writes finish only when the test lets
// them: it tells when a record arrives, and holds its caller until
// release.
type heldAudit struct {
	arrived chan store.Record
	release chan struct{}
}

func newHeldAudit() *heldAudit {
	return &heldAudit{arrived: make(chan store.Record, 16), release: make(chan struct{})}
}

func (h *heldAudit) Record(r store.Record) {
	if r.Kind == "net" {
		return
	}
	h.arrived <- r
	<-h.release
}

// An answer is never sent before its audit record is stored: executions,
// commands and one-shot runs return, and a process's end is told to its
// subscribers, only once the audit log has taken the record.
func TestAnswersWaitForTheirAuditRecord(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	b, err := native.New(native.Config{CgroupParent: "vivarium-service-test", UIDBase: native.DefaultUIDBase + 22<<24})
	if err != nil {
		t.Fatal(err)
	}
	audit := newHeldAudit()
	svc := service.New(service.Config{Backend: b, Audit: audit.Record})
	t.Cleanup(func() {
		close(audit.release) // nothing may be held when the service closes
		svc.Close()
		b.Close()
	})
	ctx := context.Background()
	info, err := svc.Create(ctx, service.CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}

	// answered runs an operation and checks that it does not return before
	// its record has been released, then releases it.
	answered := func(kind string, op func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- op() }()
		r := <-audit.arrived
		if r.Kind != kind || r.KeyID != "alice" {
			t.Fatalf("record %+v, want %s of alice", r, kind)
		}
		select {
		case err := <-done:
			t.Fatalf("%s answered (%v) before its audit record was stored", kind, err)
		default:
		}
		audit.release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	answered("execute", func() error {
		_, err := svc.Execute(ctx, "alice", info.ID, sandbox.ExecRequest{Code: "print(1)"}, nil)
		return err
	})
	answered("command", func() error {
		_, err := svc.Command(ctx, "alice", info.ID, service.CommandRequest{Cmd: "true"}, nil)
		return err
	})
	answered("run_once", func() error {
		_, err := svc.RunOnce(ctx, "alice", sandbox.OneShot{Request: sandbox.ExecRequest{Code: "print(1)"}})
		return err
	})

	// A process: its subscriber hears of its end only after the record.
	_, sub, err := svc.StartProcess(ctx, "alice", info.ID, service.ProcessRequest{Argv: []string{"/bin/echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	r := <-audit.arrived
	if r.Kind != "command" || r.Status != string(sandbox.StatusOK) {
		t.Fatalf("record %+v", r)
	}
	// Its end is decided and recorded, not yet told: every event the
	// subscriber can have by now is output.
	for drained := false; !drained; {
		select {
		case ev := <-sub.Events():
			if ev.End != nil {
				t.Fatalf("the process's end (%+v) was told before its audit record was stored", *ev.End)
			}
		default:
			drained = true
		}
	}
	audit.release <- struct{}{}
	var end *service.ProcessEnd
	for ev := range sub.Events() {
		if ev.End != nil {
			end = ev.End
		}
	}
	if end == nil || end.Status != sandbox.StatusOK {
		t.Fatalf("end %v", end)
	}
}

// With the audit log's disk full, executions go on: each is answered
// once its record's write has failed, and /metrics says records are
// being lost.
func TestExecutionsGoOnWhenTheAuditDiskIsFull(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	dataDir := testutil.SmallFS(t, 4<<20)
	st, err := store.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var logged testutil.Buffer
	audit := store.NewAuditLog(st, slog.New(slog.NewTextHandler(&logged, nil)), store.AuditOptions{})
	defer audit.Close()
	b, err := native.New(native.Config{CgroupParent: "vivarium-service-test", UIDBase: native.DefaultUIDBase + 22<<24})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{Backend: b, Audit: audit.Record})
	svc.Metrics().SetAuditStats(audit.Stats)
	t.Cleanup(func() {
		svc.Close()
		b.Close()
	})
	ctx := context.Background()
	info, err := svc.Create(ctx, service.CreateRequest{Owner: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.FillFS(t, dataDir)
	// The write-ahead log has room for a few commits where it was
	// written before; executions go on past them.
	for i := range 20 {
		res, err := svc.Execute(ctx, "alice", info.ID, sandbox.ExecRequest{Code: fmt.Sprintf("print(%d * 2)", i)}, nil)
		if err != nil || res.Status != sandbox.StatusOK || strings.TrimSpace(res.Stdout) != fmt.Sprint(i*2) {
			t.Fatalf("execution %d with the audit log's disk full: %+v %v", i, res, err)
		}
	}
	audit.Flush() // the last records' batch may still be being written
	var metrics strings.Builder
	svc.WriteMetrics(&metrics)
	for _, want := range []string{"vivarium_audit_write_failing 1\n", "vivarium_audit_records_lost_total "} {
		if !strings.Contains(metrics.String(), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics.String())
		}
	}
	if n := strings.Count(logged.String(), "audit log write failed"); n != 1 {
		t.Errorf("%d log lines of the failure, want 1:\n%s", n, logged.String())
	}
}
