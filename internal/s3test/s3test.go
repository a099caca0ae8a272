// Package s3test runs real S3-compatible servers on loopback for tests:
// versitygw (Apache-2.0) over its posix backend, which honours If-Match
// and If-None-Match under a per-key lock, and s3rver, an emulator that
// ignores them. The binaries are built or installed once into the user's
// cache directory, unless the environment names them.
package s3test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/leasefence/leasefence/internal/toolcache"
)

// VersityVersion is the versitygw release the tests run.
const VersityVersion = "v1.8.0"

// Server is an S3-compatible server process on loopback.
type Server struct {
	Endpoint       string // http://127.0.0.1:port
	Access, Secret string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// Client is an S3 client of the server, path-style, with its credentials.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(s.Access, s.Secret, ""),
		UsePathStyle: true,
	})
}

// Bucket creates a bucket with a random name and returns it.
func (s *Server) Bucket(ctx context.Context) (string, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "leasefence-" + hex.EncodeToString(b[:])
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		return "", fmt.Errorf("create bucket %s: %w", name, err)
	}
	return name, nil
}

// Signal sends sig to the server's process (SIGSTOP pauses it).
//
// A SIGSTOP returns once the kernel shows the process stopped (up to a
// second): the signal is delivered asynchronously, and a request sent
// just after it could otherwise still be served.
func (s *Server) Signal(sig os.Signal) {
	_ = s.cmd.Process.Signal(sig)
	if sig != syscall.SIGSTOP {
		return
	}
	stat := fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return // not Linux, or gone
		}
		// The state follows the command name in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
	}
}

// Stop ends the server, paused or not, and waits for it.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// StartVersity starts versitygw on a free loopback port over a posix
// backend in dir (which must exist), and waits until it answers.
func StartVersity(ctx context.Context, dir string) (*Server, error) {
	bin, err := VersityBinary(ctx)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Endpoint: "http://" + port, Access: "leasefence", Secret: "leasefence-secret"}
	s.cmd = exec.Command(bin, "--access", s.Access, "--secret", s.Secret, "--port", port, "--quiet", "posix", dir)
	return s, s.start(ctx)
}

// StartVersityT starts versitygw for a test, in a directory of its own,
// stopped when the test ends, and returns it with a fresh bucket.
func StartVersityT(tb testing.TB) (*Server, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a first build takes minutes
	defer cancel()
	s, err := StartVersity(ctx, tb.TempDir())
	if err != nil {
		tb.Fatalf("start versitygw: %v", err)
	}
	tb.Cleanup(s.Stop)
	bucket, err := s.Bucket(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return s, bucket
}

func (s *Server) start(ctx context.Context) error {
	var out tail
	s.cmd.Stdout, s.cmd.Stderr = &out, &out
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	host := s.Endpoint[len("http://"):]
	for {
		conn, err := net.DialTimeout("tcp", host, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%s exited before it listened: %s", s.cmd.Path, out.String())
		case <-ctx.Done():
			s.Stop()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond): // polling a port: no event to wait on
		}
	}
}

// S3rverVersion is the s3rver release the tests run: an emulator from
// before S3 had conditional writes, which ignores If-Match and
// If-None-Match.
const S3rverVersion = "3.7.1"

// StartS3rver starts s3rver on a free loopback port over dir, and waits
// until it answers. It needs node and npm.
func StartS3rver(ctx context.Context, dir string) (*Server, error) {
	script, err := s3rverScript(ctx)
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	host, p, _ := net.SplitHostPort(port)
	// s3rver checks signatures made with its fixed credentials.
	s := &Server{Endpoint: "http://" + port, Access: "S3RVER", Secret: "S3RVER"}
	s.cmd = exec.Command("node", script, "-d", dir, "-a", host, "-p", p, "--silent", "--no-vhost-buckets")
	return s, s.start(ctx)
}

// StartS3rverT starts s3rver for a test, stopped when the test ends, and
// returns it with a fresh bucket.
func StartS3rverT(tb testing.TB) (*Server, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := StartS3rver(ctx, tb.TempDir())
	if err != nil {
		tb.Fatalf("start s3rver: %v", err)
	}
	tb.Cleanup(s.Stop)
	bucket, err := s.Bucket(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return s, bucket
}

// s3rverScript is $LEASEFENCE_S3RVER, or s3rver installed once with npm
// into the user cache directory.
func s3rverScript(ctx context.Context) (string, error) {
	if p := os.Getenv("LEASEFENCE_S3RVER"); p != "" {
		return p, nil
	}
	dir, err := toolcache.Dir("s3rver-" + S3rverVersion)
	if err != nil {
		return "", err
	}
	script := filepath.Join(dir, "node_modules", "s3rver", "bin", "s3rver.js")
	return script, toolcache.Once(ctx, dir, script, func() *exec.Cmd {
		return exec.CommandContext(ctx, "npm", "install", "--no-audit", "--no-fund", "--prefix", dir, "s3rver@"+S3rverVersion)
	})
}

// VersityBinary is $LEASEFENCE_VERSITYGW, or versitygw built once with go
// install into the user cache directory.
func VersityBinary(ctx context.Context) (string, error) {
	if p := os.Getenv("LEASEFENCE_VERSITYGW"); p != "" {
		return p, nil
	}
	dir, err := toolcache.Dir("versitygw-" + VersityVersion)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "versitygw")
	return bin, toolcache.Once(ctx, dir, bin, func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, "go", "install", "github.com/versity/versitygw/cmd/versitygw@"+VersityVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
		return cmd
	})
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// tail keeps the last 4 KiB a server printed, for an error if it fails to
// start; the rest is dropped.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
