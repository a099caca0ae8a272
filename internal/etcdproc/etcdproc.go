// Package etcdproc runs real etcd servers as child processes for the tests
// of the library's own module, or points them at the cluster named in
// ETCD_ENDPOINTS. It is also the one place, for every module's tests, of
// what does not depend on how the server runs: the shared Env and its
// run, LeakCheck, Name, Ctx, the clients, and the fault Proxy. Package
// etcdtest adds only what an embedded server needs.
//
// The library's module must not require etcd's server module: a module's
// requirements, its tests' included, are in the graph of every module that
// imports it. So the server runs as a program, built once per machine from
// the published server module (see Binary), the way the object fence's
// tests run an S3 gateway. Tests that need a server in process (a member
// held mid-apply, a snapshot restored under a running client) live in the
// fault suite's module, with package etcdtest.
package etcdproc

import (
	"context"
	"os"

	"github.com/leasefence/leasefence/internal/toolcache"
)

// ServerVersion is the etcd server the tests start unless EnvBinary names
// another: the newest release the library supports.
const ServerVersion = "v3.7.3"

// EnvBinary names the environment variable that gives the path of an etcd
// binary to run instead of building ServerVersion.
const EnvBinary = "LEASEFENCE_ETCD"

// Binary returns the etcd server to run: $LEASEFENCE_ETCD, or etcd
// ServerVersion built once into the user's cache directory (a few minutes
// the first time, on a small machine).
func Binary(ctx context.Context) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		return p, nil
	}
	return toolcache.Build(ctx, toolcache.Program{
		Name:     "etcd",
		Version:  ServerVersion,
		Requires: []string{"go.etcd.io/etcd/server/v3@" + ServerVersion},
		Package:  "go.etcd.io/etcd/server/v3",
	})
}
