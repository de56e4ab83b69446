package testutil

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// Wheel builds a pure-Python wheel (PEP 427: a zip with the package's
// files, METADATA, WHEEL and RECORD) in dir and returns its path. files
// maps paths inside the wheel to their content; requires lists
// Requires-Dist entries.
func Wheel(t testing.TB, dir, name, version string, files map[string]string, requires ...string) string {
	t.Helper()
	dist := strings.NewReplacer("-", "_", ".", "_").Replace(name)
	info := fmt.Sprintf("%s-%s.dist-info", dist, version)
	meta := fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", name, version)
	for _, r := range requires {
		meta += "Requires-Dist: " + r + "\n"
	}
	all := map[string]string{
		info + "/METADATA": meta,
		info + "/WHEEL":    "Wheel-Version: 1.0\nGenerator: vivarium-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	for k, v := range files {
		all[k] = v
	}
	var names []string
	for k := range all {
		names = append(names, k)
	}
	sort.Strings(names)
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-py3-none-any.whl", dist, version))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z := zip.NewWriter(f)
	var record strings.Builder
	for _, n := range names {
		w, err := z.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(all[n]))
		sum := sha256.Sum256([]byte(all[n]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(all[n]))
	}
	record.WriteString(info + "/RECORD,,\n")
	w, err := z.Create(info + "/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}
