//go:build tools

package chaos

// The fault suite builds the real etcd server from this module's
// dependencies (go build go.etcd.io/etcd/server/v3) to run members as child
// processes it can SIGKILL. This import keeps what that build needs in
// go.mod and go.sum.
import _ "go.etcd.io/etcd/server/v3/etcdmain"
