package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
)

// Find returns the paths of a kube-apiserver and an etcd binary.
//
// kube-apiserver is looked for in order: $VIVARIUM_KUBE_APISERVER (the
// binary), $VIVARIUM_KUBE_DIR/kube-apiserver, then the newest
// kube-*/kube-apiserver that scripts/kube/build.sh left under
// ${XDG_CACHE_HOME:-$HOME/.cache}/vivarium. etcd: $VIVARIUM_ETCD, then
// /usr/bin/etcd (Debian's etcd-server, which the script installs), then
// etcd on $PATH.
func Find() (apiserver, etcd string, err error) {
	var cands []string
	if p := os.Getenv("VIVARIUM_KUBE_APISERVER"); p != "" {
		cands = append(cands, p)
	}
	if d := os.Getenv("VIVARIUM_KUBE_DIR"); d != "" {
		cands = append(cands, filepath.Join(d, "kube-apiserver"))
	}
	built, pattern := fileutil.CachedBuilds("kube", "kube-apiserver")
	cands = append(cands, built...)
	apiserver = firstExecutable(cands)
	if apiserver == "" {
		return "", "", fmt.Errorf("%w (looked in %s)", ErrNotFound, pattern)
	}

	cands = nil
	if p := os.Getenv("VIVARIUM_ETCD"); p != "" {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/etcd")
	if p, err := exec.LookPath("etcd"); err == nil {
		cands = append(cands, p)
	}
	etcd = firstExecutable(cands)
	if etcd == "" {
		return "", "", fmt.Errorf("%w (no etcd: scripts/kube/build.sh installs Debian's etcd-server)", ErrNotFound)
	}
	return apiserver, etcd, nil
}

func firstExecutable(paths []string) string {
	for _, p := range paths {
		st, err := os.Stat(p)
		if err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}
