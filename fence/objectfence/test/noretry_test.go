package objectfence_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// loseAnswers is a proxy in front of an S3 server that, once armed,
// forwards each PUT to the server, lets it land, and then loses its
// answer: a 503, or the connection closed with no answer at all.
type loseAnswers struct {
	srv   *httptest.Server
	armed atomic.Bool
	close bool // close the connection instead of answering 503
	puts  atomic.Int32
}

var errLost = errors.New("answer lost on purpose")

func newLoseAnswers(t *testing.T, upstream string, closeConn bool) *loseAnswers {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	p := &loseAnswers{close: closeConn}
	rp := httputil.NewSingleHostReverseProxy(u) // keeps the Host header the client signed
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method == http.MethodPut && strings.HasSuffix(r.Request.URL.Path, "/manifest") {
			p.puts.Add(1)
			if p.armed.Load() {
				return errLost // the put has landed: lose its answer
			}
		}
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		if !errors.Is(err, errLost) || !p.close {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if conn, _, herr := http.NewResponseController(w).Hijack(); herr == nil {
			conn.Close()
		}
	}
	p.srv = httptest.NewServer(rp)
	t.Cleanup(p.srv.Close)
	return p
}

// A conditional put that lands but loses its answer is not sent again:
// the client's retryer would meet the put's own write, fail its condition
// and make the fence report "not claimed" (or, alone, succeed after three
// puts) for a commit that is in the manifest. The fence says the outcome
// is unknown, after one put, through the real SDK client with its default
// retryer and with one that asks for more attempts, for a 503 and for a
// closed connection. The holder then goes on as the package says: the
// same commit again on the same base is refused, since the first landed,
// and a claim with the same token writes nothing and returns the manifest
// with the commit in it, the base of the next commit.
func TestCommitWithLostAnswerIsUnknownNotRetried(t *testing.T) {
	srv, bucket := s3test.StartVersityT(t)
	for _, closeConn := range []bool{false, true} {
		for _, attempts := range []int{0, 5} { // 0: the SDK's default
			name := fmt.Sprintf("%s, retry attempts %d", map[bool]string{false: "503", true: "closed connection"}[closeConn], attempts)
			t.Run(name, func(t *testing.T) {
				p := newLoseAnswers(t, srv.Endpoint, closeConn)
				cli := s3.New(s3.Options{ // a retryer, as a user's client has
					BaseEndpoint:     aws.String(p.srv.URL),
					Region:           "us-east-1",
					Credentials:      credentials.NewStaticCredentialsProvider(srv.Access, srv.Secret, ""),
					UsePathStyle:     true,
					RetryMaxAttempts: attempts,
				})
				store, err := objectfence.NewS3Store(cli, bucket)
				if err != nil {
					t.Fatal(err)
				}
				key := fmt.Sprintf("lost-%t-%d/manifest", closeConn, attempts)
				f, err := objectfence.New(store, key, lockName)
				if err != nil {
					t.Fatal(err)
				}
				ctx := testCtx(t)
				base := mustCommit(t, f, 5, "batch-1")
				p.armed.Store(true)
				before := p.puts.Load()
				_, err = f.Commit(ctx, base, []byte("batch-2"))
				if !errors.Is(err, fence.ErrOutcomeUnknown) {
					t.Fatalf("commit whose answer was lost: %v, want ErrOutcomeUnknown", err)
				}
				if errors.Is(err, objectfence.ErrNotClaimed) || errors.Is(err, fence.ErrStale) {
					t.Fatalf("commit whose answer was lost reported refused: %v", err)
				}
				if n := p.puts.Load() - before; n != 1 {
					t.Fatalf("%d puts reached the server for one commit, want 1 (no retry)", n)
				}
				p.armed.Store(false)
				wantManifest(t, f, 5, "batch-2") // it landed
				// Committing the same payload on the same base again finds it
				// landed: the manifest as it is, with no second write.
				before = p.puts.Load()
				if m, err := f.Commit(ctx, base, []byte("batch-2")); err != nil || string(m.Payload) != "batch-2" {
					t.Fatalf("the same commit again: %q, %v; want batch-2, nil", m.Payload, err)
				}
				if n := p.puts.Load() - before; n != 1 {
					t.Fatalf("the same commit again sent %d puts, want 1 (refused)", n)
				}
				wantManifest(t, f, 5, "batch-2")
				_, err = f.Commit(ctx, base, []byte("batch-other"))
				wantErr(t, err, objectfence.ErrNotClaimed)
				before = p.puts.Load()
				again := mustClaim(t, f, 5)
				if string(again.Payload) != "batch-2" || p.puts.Load() != before {
					t.Fatalf("claim after the lost answer = %q with %d puts; want batch-2, none", again.Payload, p.puts.Load()-before)
				}
				if _, err := f.Commit(ctx, again, []byte("batch-3")); err != nil {
					t.Fatalf("commit on the new claim: %v", err)
				}
				wantManifest(t, f, 5, "batch-3")
			})
		}
	}
}

// dropOpts is an S3Client that forwards to *s3.Client without the
// per-request options (as many hand-written wrappers for metrics or
// tracing do). doc.go: "never retried ... by the S3 client's own retryer,
// whatever client is passed".
type dropOpts struct{ *s3.Client }

func (c dropOpts) PutObject(ctx context.Context, in *s3.PutObjectInput, _ ...func(*s3.Options)) (*s3.PutObjectOutput, error) {
	return c.Client.PutObject(ctx, in)
}

// loseOnce lets the first armed manifest PUT land and answers it 503;
// later answers pass.
func loseOnce(t *testing.T, upstream string) (*httptest.Server, *atomic.Bool, *atomic.Int32) {
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	var puts atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.Method == http.MethodPut && strings.HasSuffix(r.Request.URL.Path, "/manifest") {
			puts.Add(1)
			if armed.CompareAndSwap(true, false) {
				return errLost
			}
		}
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusServiceUnavailable) }
	p := httptest.NewServer(rp)
	t.Cleanup(p.Close)
	return p, &armed, &puts
}

// A client that drops the per-request options, so that its own retryer
// sends a put again whose answer was lost: the put's second send fails its
// condition against the first, and the commit must not read that as "not
// written". It finds its own payload and succeeds, or says the outcome is
// unknown.
func TestWrappedClientRetryIsNotReadAsRefusal(t *testing.T) {
	srv, bucket := s3test.StartVersityT(t)
	p, armed, puts := loseOnce(t, srv.Endpoint)
	cli := s3.New(s3.Options{
		BaseEndpoint: aws.String(p.URL),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(srv.Access, srv.Secret, ""),
		UsePathStyle: true,
	})
	store, err := objectfence.NewS3Store(dropOpts{cli}, bucket)
	if err != nil {
		t.Fatal(err)
	}
	f, err := objectfence.New(store, "w/manifest", lockName)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	base := mustClaim(t, f, 5)
	armed.Store(true)
	before := puts.Load()
	_, err = f.Commit(ctx, base, []byte("batch-1"))
	m, rerr := f.Read(ctx)
	if rerr != nil || string(m.Payload) != "batch-1" {
		t.Fatalf("the put landed, then: read %q, %v", m.Payload, rerr)
	}
	// The client re-sent the put whose answer was lost; its 412 must not
	// read as "not written": the commit finds its own payload and succeeds
	// (or, had it not, would report the outcome unknown).
	if err != nil && !errors.Is(err, fence.ErrOutcomeUnknown) {
		t.Fatalf("lost answer: %d puts sent, err=%v, yet the manifest holds %q", puts.Load()-before, err, m.Payload)
	}
}
