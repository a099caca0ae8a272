// Package toolcache builds the programs the tests run as child processes
// (etcd's server, etcd's fault proxy, an S3 gateway) once per machine, into
// the user's cache directory, so that no module of this repository has to
// require them.
package toolcache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Dir returns the cache directory for name (made if missing):
// $XDG_CACHE_HOME/leasefence/name or the platform's equivalent.
func Dir(name string) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("toolcache: %w", err)
	}
	dir := filepath.Join(base, "leasefence", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("toolcache: %w", err)
	}
	return dir, nil
}

// Once runs install unless target exists, holding a lock file in dir so
// that the test binaries of several packages build it once between them.
// The command must create target; a failed run leaves nothing in its place.
func Once(ctx context.Context, dir, target string, install func() *exec.Cmd) error {
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("toolcache: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("toolcache: lock %s: %w", dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if _, err := os.Stat(target); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("toolcache: %w", err)
	}
	cmd := install()
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.Remove(target)
		return fmt.Errorf("toolcache: %s: %w\n%s", cmd.String(), err, out)
	}
	return ctx.Err()
}

// Program describes a Go program built from published modules: the
// module versions it requires, the package to build, and, for a program
// of our own, its source files (name to contents) in the main package.
type Program struct {
	Name     string            // the binary's name, and its cache directory's prefix
	Version  string            // part of the cache directory's name: a new version builds anew
	Requires []string          // module@version, each fetched with go get
	Package  string            // the package to build; "." for Files
	Files    map[string]string // source of a main package of our own, or nil
}

// Build returns the path of p's binary, building it first if this machine
// has not. The build runs in a throw-away module of its own under the cache
// directory, outside any workspace, so that it neither reads nor changes
// this repository's go.mod files; it needs the module proxy the first time.
func Build(ctx context.Context, p Program) (string, error) {
	dir, err := Dir(p.Name + "-" + p.Version)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, p.Name)
	err = Once(ctx, dir, bin, func() *exec.Cmd {
		return exec.CommandContext(ctx, "sh", "-c", script(p), "build", bin)
	})
	return bin, err
}

// script is the shell script that makes the throw-away module and builds
// p into $1. Build writes nothing but the module's own files.
func script(p Program) string {
	s := `set -e
export GOWORK=off GOFLAGS=-mod=mod
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cd "$src"
go mod init leasefence-tool >/dev/null 2>&1
`
	for name, body := range p.Files {
		s += fmt.Sprintf("cat > %q <<'LEASEFENCE_EOF'\n%s\nLEASEFENCE_EOF\n", name, body)
	}
	for _, r := range p.Requires {
		s += fmt.Sprintf("go get %q\n", r)
	}
	s += fmt.Sprintf("go build -o \"$1.tmp\" %q\nmv \"$1.tmp\" \"$1\"\n", p.Package)
	return s
}
