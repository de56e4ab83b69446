package native

import (
	"context"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A sandbox whose init dies on its own, not by Close, says so in the log
// with its id (its calls fail as closed from then on, and without the log
// nothing would tell an operator why); a Close says nothing.
func TestInitGoneLogged(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	var log testutil.Buffer
	b, err := New(Config{CgroupParent: "vivarium-native-initgone-test", UIDBase: DefaultUIDBase + 35<<24, UIDRanges: 4,
		Zygote: testutil.ZygoteMode(), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	open := func() *Sandbox {
		sb, err := b.Create(context.Background(), sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		s := sb.(*Sandbox)
		execText(t, s, "40 + 2")
		return s
	}
	closed := open()
	closed.Close()
	// A one-shot sandbox ends with its runner: no news either.
	sb, err := b.Create(context.Background(), sandbox.Spec{OneShot: true})
	if err != nil {
		t.Fatal(err)
	}
	once := sb.(*Sandbox)
	if _, err := once.Execute(context.Background(), sandbox.ExecRequest{Code: "1"}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-once.ctlDone: // its control socket was read to its end
	case <-time.After(10 * time.Second):
		t.Fatal("a one-shot sandbox's init outlived its runner")
	}
	once.Close()
	s := open()
	defer s.Close()
	s.lifeMu.Lock()
	pid := s.init.pid
	s.lifeMu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "its init is gone"); {
		if time.Now().After(deadline) {
			t.Fatalf("no word of the dead init in the log:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := log.String(); !strings.Contains(got, "id="+s.ID()) || strings.Contains(got, "id="+closed.ID()) ||
		strings.Contains(got, "id="+once.ID()) {
		t.Fatalf("the log names the wrong sandboxes (%s dead, %s closed, %s one-shot):\n%s", s.ID(), closed.ID(), once.ID(), got)
	}
	if _, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: "1"}, nil); err == nil {
		t.Fatal("a sandbox without its init still runs code")
	}
}
