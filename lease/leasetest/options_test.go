package leasetest_test

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/leasefence/leasefence/lease/leasetest"
)

// fatalRecorder is a testing.TB whose Fatal ends only the goroutine that
// called it, so that a test can see NewServer refuse its options.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// Bad options fail the test before any server starts.
func TestNewServerRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []leasetest.Option
		want string
	}{
		{"nil", []leasetest.Option{nil}, "leasetest: nil Option"},
		{"nil after a good one", []leasetest.Option{leasetest.WithLogger(zap.NewNop()), nil}, "leasetest: nil Option"},
		{"election timeout too short", []leasetest.Option{leasetest.WithElectionTimeout(10 * time.Millisecond)}, "leasetest: election timeout 10ms: want 50ms to 1m"},
		{"election timeout too long", []leasetest.Option{leasetest.WithElectionTimeout(2 * time.Minute)}, "leasetest: election timeout 2m0s: want 50ms to 1m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &fatalRecorder{TB: t}
			done := make(chan *leasetest.Server)
			go func() {
				defer close(done)
				done <- leasetest.NewServer(rec, tc.opts...)
			}()
			if srv := <-done; srv != nil {
				t.Fatalf("NewServer started a server with bad options")
			}
			if rec.msg != tc.want {
				t.Fatalf("NewServer failed with %q, want %q", rec.msg, tc.want)
			}
		})
	}
}

// Good options reach the server: the shortest lease it grants follows the
// election timeout, and its logs go to the logger given.
func TestNewServerAppliesOptions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // 0: etcd's default
		wantTTL int64         // of a lease asked for 1 s
	}{
		{"default", 0, 2},
		{"500ms election timeout", 500 * time.Millisecond, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			opts := []leasetest.Option{leasetest.WithLogger(zap.New(core))}
			if tc.timeout != 0 {
				opts = append(opts, leasetest.WithElectionTimeout(tc.timeout))
			}
			cli := leasetest.NewServer(t, opts...).Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			g, err := cli.Grant(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			if g.TTL != tc.wantTTL {
				t.Errorf("a 1s lease was granted for %ds, want %ds", g.TTL, tc.wantTTL)
			}
			if logs.Len() == 0 {
				t.Error("the server logged nothing to the logger given")
			}
		})
	}
}

// The package imports no internal package, of this repository or of
// etcd: its module is taken at a version on its own, so it may depend only
// on what other modules publish, and no type of its API can be one a user
// cannot name.
func TestImportsNoInternalPackage(t *testing.T) {
	fset := token.NewFileSet()
	files := parsePackage(t, fset)
	if len(files) == 0 {
		t.Fatal("no file parsed: this test checks nothing")
	}
	for _, f := range files {
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains("/"+p+"/", "/internal/") {
				t.Errorf("%s imports internal package %s", fset.Position(f.Pos()).Filename, p)
			}
		}
	}
}

// parsePackage parses the package's files, tests left out.
func parsePackage(t *testing.T, fset *token.FileSet) []*ast.File {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}
