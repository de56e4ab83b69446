package kubetest

import "errors"

// ErrNotFound: no kube-apiserver built by scripts/kube/build.sh, or no etcd.
var ErrNotFound = errors.New("kube-apiserver or etcd not found: run scripts/kube/build.sh, or set VIVARIUM_KUBE_APISERVER to a kube-apiserver binary")
