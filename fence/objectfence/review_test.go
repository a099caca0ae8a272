package objectfence_test

// Found by a cold review that tried to break the fence: each of these
// failed before its fix, and names the promise of doc.go it checks.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/objectfence"
	"github.com/leasefence/leasefence/internal/s3test"
)

// doc.go: "Bad input (... a Commit on a Manifest that Claim or Commit did
// not return ...) is refused ... before anything is sent" and "A Claim or
// Commit whose token is lower than one the manifest has accepted never
// lands". A base whose exported Version was cleared is sent as an
// UNCONDITIONAL put: token 5 overwrites the manifest after token 7 claimed
// and committed it.
func TestReviewBaseWithEmptyVersionIsUnconditional(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b5 := mustClaim(t, f, 5)
	mustCommit(t, f, 7, "seven")
	b5.Version = ""
	_, err := f.Commit(ctx, b5, []byte("stale five"))
	m, _ := f.Read(ctx)
	if err == nil || m.Token != 7 {
		t.Fatalf("commit of token 5 on a base with no version: err=%v; manifest now token %d payload %q (token 7 had committed)",
			err, m.Token, m.Payload)
	}
}

// The "obvious fix" after ErrNotClaimed/Stale: copy the current Version
// from Read into an old base. The put's If-Match then holds and the
// manifest's token goes DOWN from 7 to 5; the old holder's Claim(5) then
// succeeds with nothing written, and it can keep committing.
func TestReviewBaseWithPatchedVersionLowersToken(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b5 := mustClaim(t, f, 5)
	mustCommit(t, f, 7, "seven")
	_, err := f.Commit(ctx, b5, []byte("x"))
	wantStale(t, err, 5, 7)
	r, err := f.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b5.Version = r.Version
	_, err = f.Commit(ctx, b5, []byte("stale five"))
	m, _ := f.Read(ctx)
	if err == nil || m.Token != 7 {
		t.Fatalf("commit of token 5 on a patched base: err=%v; manifest now token %d payload %q", err, m.Token, m.Payload)
	}
}

// doc.go: "a token below 1 ... is refused with an error wrapping
// fence.ErrInvalidArgument before anything is sent". Commit takes its
// token from base.Token and never checks it: token 0 is written, and the
// manifest can no longer be read, claimed or committed by anyone
// (decodeManifest refuses token <= 0).
func TestReviewBaseWithZeroTokenBricksManifest(t *testing.T) {
	f, _, _ := newFence(t)
	ctx := testCtx(t)
	b := mustClaim(t, f, 5)
	b.Token = 0
	_, err := f.Commit(ctx, b, []byte("p"))
	if !errors.Is(err, fence.ErrInvalidArgument) {
		_, rerr := f.Read(ctx)
		_, cerr := f.Claim(ctx, 9)
		t.Fatalf("commit with token 0: err=%v (want ErrInvalidArgument); then read: %v; claim(9): %v", err, rerr, cerr)
	}
}

// memStore is a store that honours If-Match / If-None-Match exactly, on
// its own version strings, but whose versions do not identify the content:
// here the size (as an "mtime-size" ETag with a coarse clock is, for two
// writes in the same second). doc.go: "A Fence builds the fence ... on any
// store that honours those conditions (Check proves it does)".
type memStore struct {
	mu   sync.Mutex
	objs map[string][]byte
}

func (s *memStore) ver(b []byte) string { return fmt.Sprintf(`"size-%d"`, len(b)) }

func (s *memStore) Get(_ context.Context, key string) ([]byte, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objs[key]
	if !ok {
		return nil, "", objectfence.ErrNotFound
	}
	return b, s.ver(b), nil
}

func (s *memStore) Put(_ context.Context, key string, body []byte, c objectfence.Condition) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.objs[key]
	switch {
	case c.IfAbsent && ok:
		return "", objectfence.ErrPreconditionFailed
	case c.IfMatch != "" && !ok:
		return "", objectfence.ErrNotFound
	case c.IfMatch != "" && s.ver(cur) != c.IfMatch:
		return "", objectfence.ErrPreconditionFailed
	}
	s.objs[key] = append([]byte(nil), body...)
	return s.ver(body), nil
}

func (s *memStore) Delete(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objs, key)
	return nil
}

func (s *memStore) List(_ context.Context, prefix string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

func TestReviewCheckRefusesStoreWhoseVersionsRepeat(t *testing.T) {
	f, err := objectfence.New(&memStore{objs: map[string][]byte{}}, "m", lockName)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	if err := f.Check(ctx); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("check of a store whose version is the body's size: %v, want ErrConditionsIgnored", err)
	}
	if _, err := f.Claim(ctx, 5); !errors.Is(err, objectfence.ErrConditionsIgnored) {
		t.Fatalf("claim on it: %v, want ErrConditionsIgnored", err)
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

func TestReviewWrappedClientRetriesLostAnswer(t *testing.T) {
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
