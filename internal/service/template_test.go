package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A template's USER becomes its sandboxes' user as the image's
// /etc/passwd and /etc/group give it; a user the image does not name, or
// ids a sandbox does not have, are refused as the spec's fault.
func TestResolveTemplateUser(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1235::/home/app:/bin/sh\nbig:x:70000:70000::/:/bin/sh\n",
		"group":  "root:x:0:\napp:x:1235:\nstaff:x:50:app\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, "etc", name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store, err := image.Open(filepath.Join(t.TempDir(), "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user string
		want *sandbox.RootUser // nil: the default
		err  string
	}{
		{"", nil, ""},
		{"app", &sandbox.RootUser{UID: 1234, GID: 1235, Groups: []uint32{50}, Name: "app"}, ""},
		{"app:root", &sandbox.RootUser{UID: 1234, GID: 0, Name: "app"}, ""},
		{"0", &sandbox.RootUser{UID: 0, GID: 0, Name: "root"}, ""},
		{"4321", &sandbox.RootUser{UID: 4321, GID: 0}, ""},
		{"ghost", nil, "invalid username: 'ghost'"},
		{"big", nil, "ids 0 to 65535"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			img := testutil.DirImage(t, dir, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, User: tc.user})
			if _, err := store.Add(context.Background(), "tpl:1", img, nil); err != nil {
				t.Fatal(err)
			}
			spec := sandbox.Spec{Template: "tpl:1"}
			_, err = resolveTemplate(store, &spec, "tpl:1")
			if tc.err != "" {
				if !errors.Is(err, sandbox.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("USER %q: %v, want an invalid spec saying %q", tc.user, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := spec.Root.User; !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("USER %q: %+v, want %+v", tc.user, got, tc.want)
			}
			if err := spec.Validate(); err != nil {
				t.Fatalf("the spec: %v", err)
			}
		})
	}
}
