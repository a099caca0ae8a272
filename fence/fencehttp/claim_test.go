package fencehttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencehttp"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
	"github.com/leasefence/leasefence/lease"
)

// send makes one request to url with the headers attach sets for h (none
// for a nil attach), and returns the answer with its body read.
func send(t *testing.T, method, url, body string, attach func(*http.Request, fence.Holder) error, h fence.Holder) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if attach != nil {
		if err := attach(req, h); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// The four steps of the gap between a new holder's first read and its first
// write. A (token 3) wrote "A1"; B (token 6) takes the lock and reads; A's
// write "A2", sent before B took the lock, arrives; B writes what it read,
// extended. With a plain GET the late write is accepted after B's read, and
// B's write, built on "A1", undoes it: the resource went from A2 back to a
// successor of A1. With a claim GET it is refused, and B's read stays the
// current state until B writes.
func TestClaimClosesReadGap(t *testing.T) {
	etcdproc.LeakCheck(t)
	cases := []struct {
		name       string
		read       func(*http.Request, fence.Holder) error // B's first request
		lateStatus int
		beforeB    string // the resource when B writes
		writes     int    // writes that reached the resource
	}{
		{"plain GET", fencehttp.Attach, http.StatusOK, "A2", 3},
		{"claim GET", fencehttp.AttachClaim, http.StatusConflict, "A1", 2},
	}
	for kind, mk := range stores(t) {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				name := etcdproc.Name(t, "files")
				store, highest := mk(t)
				var reg register
				srv := serve(t, store, reg.handler(), fencehttp.WithLockName(name))
				a, b := fixedHolder{name, 3}, fixedHolder{name, 6}

				if resp, _ := send(t, http.MethodPut, srv.URL, "A1", fencehttp.Attach, a); resp.StatusCode != http.StatusOK {
					t.Fatalf("A's write: %d", resp.StatusCode)
				}
				resp, read := send(t, http.MethodGet, srv.URL, "", tc.read, b)
				if resp.StatusCode != http.StatusOK || read != "A1" {
					t.Fatalf("B's read: %d %q, want A1", resp.StatusCode, read)
				}
				late, _ := send(t, http.MethodPut, srv.URL, "A2", fencehttp.Attach, a)
				if late.StatusCode != tc.lateStatus {
					t.Fatalf("A's late write after B's read: %d, want %d", late.StatusCode, tc.lateStatus)
				}
				var want fence.StaleError // none for an accepted write
				if tc.lateStatus == http.StatusConflict {
					want = fence.StaleError{Key: name, Token: a.token, Highest: b.token}
				}
				if got := staleOf(t, late); got != want {
					t.Errorf("CheckResponse of A's late write gave %+v, want %+v", got, want)
				}
				if v, _ := reg.get(); v != tc.beforeB {
					t.Errorf("resource when B writes = %q, want %q", v, tc.beforeB)
				}
				if resp, _ := send(t, http.MethodPut, srv.URL, read+" then B", fencehttp.Attach, b); resp.StatusCode != http.StatusOK {
					t.Fatalf("B's write: %d", resp.StatusCode)
				}
				if v, n := reg.get(); v != "A1 then B" || n != tc.writes {
					t.Errorf("resource = %q after %d writes, want %q after %d", v, n, "A1 then B", tc.writes)
				}
				if h := highest(name); h != b.token {
					t.Errorf("store's highest = %d, want %d", h, b.token)
				}
			})
		}
	}
}

// staleOf is the stale error CheckResponse makes of resp, the zero value
// if none; any other error fails the test.
func staleOf(t *testing.T, resp *http.Response) fence.StaleError {
	t.Helper()
	err := fencehttp.CheckResponse(resp)
	if err == nil {
		return fence.StaleError{}
	}
	var se *fence.StaleError
	if !errors.As(err, &se) || !errors.Is(err, fence.ErrStale) {
		t.Errorf("CheckResponse = %v, not a stale error", err)
		return fence.StaleError{}
	}
	return *se
}

// fixture is a store of one kind, a resource beside it, and the store's
// atomic step for the resource's writes.
type fixture struct {
	store fencestore.Store
	// highest reads the store's record of name, 0 if none.
	highest func(ctx context.Context, name string) (int64, error)
	read    func(ctx context.Context) (string, error)
	// write sets the resource through the store's atomic step: a stale
	// claim gives a *fence.StaleError and the resource is unchanged.
	write func(ctx context.Context, c fencestore.Claim, v string) error
}

func fixtures() map[string]func(t *testing.T) fixture {
	return map[string]func(t *testing.T) fixture{
		"memory": func(t *testing.T) fixture {
			s := fencestore.NewMemoryStore()
			var mu sync.Mutex
			var value string
			return fixture{
				store:   s,
				highest: func(_ context.Context, name string) (int64, error) { return s.Highest(name), nil },
				read: func(context.Context) (string, error) {
					mu.Lock()
					defer mu.Unlock()
					return value, nil
				},
				write: func(ctx context.Context, c fencestore.Claim, v string) error {
					return s.Do(ctx, c, func() error {
						mu.Lock()
						defer mu.Unlock()
						value = v
						return nil
					})
				},
			}
		},
		"etcd": func(t *testing.T) fixture {
			cli := etcd.Client(t)
			s, err := fencestore.NewEtcdStore(cli, etcdproc.Name(t, "records")+"/", fencestore.WithoutVerifier()) // fixed tokens: verification has its own tests
			if err != nil {
				t.Fatal(err)
			}
			data := etcdproc.Name(t, "object")
			get := func(ctx context.Context, key string) (string, error) {
				resp, err := cli.Get(ctx, key)
				if err != nil || len(resp.Kvs) == 0 {
					return "", err
				}
				return string(resp.Kvs[0].Value), nil
			}
			return fixture{
				store: s,
				highest: func(ctx context.Context, name string) (int64, error) {
					v, err := get(ctx, s.Key(name))
					if err != nil || v == "" {
						return 0, err
					}
					return fence.DecodeToken(v)
				},
				read: func(ctx context.Context) (string, error) { return get(ctx, data) },
				write: func(ctx context.Context, c fencestore.Claim, v string) error {
					_, err := fence.NewTxn(ctx, cli, s.Guard(c)).Then(clientv3.OpPut(data, v)).Commit()
					return err
				},
			}
		},
	}
}

// probe is a handler over a fixture's resource that notes, each time it
// runs, the store's record of its lock as the handler found it: what the
// middleware had recorded before letting the request through.
type probe struct {
	fx   fixture
	lock string

	mu     sync.Mutex
	runs   int
	seen   int64 // the record when the handler last ran
	claims int   // runs that found a claim in their context
}

func (p *probe) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	seen, err := p.fx.highest(r.Context(), p.lock)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	c, ok := fencehttp.ClaimFrom(r.Context())
	p.mu.Lock()
	p.runs++
	p.seen = seen
	if ok {
		p.claims++
	}
	p.mu.Unlock()
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		v, err := p.fx.read(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, v)
	default:
		body, _ := io.ReadAll(r.Body)
		if err := p.fx.write(r.Context(), c, string(body)); err != nil {
			fencehttp.WriteError(w, c, err)
		}
	}
}

// last returns how often the handler ran, the record it last found, and
// how many runs had a claim in their context.
func (p *probe) last() (runs int, seen int64, claims int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runs, p.seen, p.claims
}

// highestOf reads the fixture's record of name from the test goroutine.
func (fx fixture) highestOf(t *testing.T, name string) int64 {
	t.Helper()
	h, err := fx.highest(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A claim is checked and recorded whatever the method, the methods that
// pass unchecked by default included, and the handler runs only once the
// record holds the claim's token. A plain request of those methods, even
// with a higher token, records nothing.
func TestClaimRecordedBeforeHandler(t *testing.T) {
	etcdproc.LeakCheck(t)
	steps := []struct {
		method string
		claim  bool
		token  int64
		want   int64 // the record afterwards, and when the handler ran
	}{
		{http.MethodGet, false, 4, 0},
		{http.MethodGet, true, 4, 4},
		{http.MethodHead, true, 5, 5},
		{http.MethodOptions, true, 6, 6},
		{http.MethodGet, false, 9, 6},
		{http.MethodPut, true, 7, 7},
		{http.MethodDelete, true, 8, 8},
	}
	for kind, mk := range fixtures() {
		t.Run(kind, func(t *testing.T) {
			fx := mk(t)
			name := etcdproc.Name(t, "files")
			p := &probe{fx: fx, lock: name}
			srv := serve(t, fx.store, p, fencehttp.WithLockName(name))
			claims := 0
			for i, st := range steps {
				attach := fencehttp.Attach
				if st.claim {
					attach = fencehttp.AttachClaim
					claims++
				}
				resp, _ := send(t, st.method, srv.URL, "x", attach, fixedHolder{name, st.token})
				runs, seen, gotClaims := p.last()
				if resp.StatusCode != http.StatusOK || runs != i+1 {
					t.Fatalf("%s claim=%v token %d: status %d, handler runs %d", st.method, st.claim, st.token, resp.StatusCode, runs)
				}
				if st.claim && seen != st.want {
					t.Errorf("%s claim token %d: the handler found the record at %d, want %d", st.method, st.token, seen, st.want)
				}
				if h := fx.highestOf(t, name); h != st.want {
					t.Errorf("%s claim=%v token %d: record %d, want %d", st.method, st.claim, st.token, h, st.want)
				}
				if gotClaims != claims {
					t.Errorf("%s claim=%v: %d runs had a claim in their context, want %d", st.method, st.claim, gotClaims, claims)
				}
			}
		})
	}
}

// Through a Transport, the claim header set on the request is enough.
func TestClaimThroughTransport(t *testing.T) {
	etcdproc.LeakCheck(t)
	cli := etcd.Client(t)
	name := etcdproc.Name(t, "files")
	store := fencestore.NewMemoryStore()
	var reg register
	srv := serve(t, store, reg.handler(), fencehttp.WithLockName(name))
	l, err := newSession(t, cli).Lock(etcdproc.Ctx(t, 30*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(etcdproc.Ctx(t, 30*time.Second))
	client := &http.Client{Transport: &fencehttp.Transport{Holder: l}}
	req, _ := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), http.MethodGet, srv.URL, nil)
	req.Header.Set(fencehttp.HeaderClaim, "1")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || store.Highest(name) != l.Token() {
		t.Errorf("claim GET through a Transport: %d, record %d, want 200 and %d", resp.StatusCode, store.Highest(name), l.Token())
	}
}

// With the check left to the handler, the middleware still records a
// claim: the handler's read does not go through the store, so nothing else
// would. A plain checked request records nothing there, and the handler's
// atomic write still refuses a token below the claim's.
func TestClaimWithCheckInHandler(t *testing.T) {
	etcdproc.LeakCheck(t)
	steps := []struct {
		what   string
		method string
		claim  bool
		token  int64
		status int
		want   int64 // the record afterwards
	}{
		{"A writes", http.MethodPut, false, 3, http.StatusOK, 3},
		{"B reads, checked but unclaimed", http.MethodGet, false, 6, http.StatusOK, 3},
		{"B claims and reads", http.MethodGet, true, 6, http.StatusOK, 6},
		{"A's late write", http.MethodPut, false, 3, http.StatusConflict, 6},
		{"B writes", http.MethodPut, false, 6, http.StatusOK, 6},
	}
	for kind, mk := range fixtures() {
		t.Run(kind, func(t *testing.T) {
			fx := mk(t)
			name := etcdproc.Name(t, "files")
			p := &probe{fx: fx, lock: name}
			// Every method checked, so that B's unclaimed read shows what
			// the middleware does with a checked request in this mode.
			srv := serve(t, fx.store, p, fencehttp.WithLockName(name), fencehttp.WithCheckInHandler(), fencehttp.WithUncheckedMethods())
			for _, st := range steps {
				attach := fencehttp.Attach
				if st.claim {
					attach = fencehttp.AttachClaim
				}
				resp, _ := send(t, st.method, srv.URL, st.what, attach, fixedHolder{name, st.token})
				if resp.StatusCode != st.status {
					t.Fatalf("%s: status %d, want %d", st.what, resp.StatusCode, st.status)
				}
				if _, seen, _ := p.last(); st.claim && seen != st.token {
					t.Errorf("%s: the handler found the record at %d, want %d", st.what, seen, st.token)
				}
				if h := fx.highestOf(t, name); h != st.want {
					t.Errorf("%s: record %d, want %d", st.what, h, st.want)
				}
			}
			if v, err := fx.read(etcdproc.Ctx(t, 30*time.Second)); err != nil || v != "B writes" {
				t.Errorf("resource = %q %v, want B's write", v, err)
			}
		})
	}
}

// A claim header the middleware cannot read, or cannot honour, is a 400
// whatever the method: never a plain read the client believes claimed. The
// handler does not run and the record is unchanged.
func TestBadClaimRefused(t *testing.T) {
	etcdproc.LeakCheck(t)
	const L, T, C = fencehttp.HeaderLock, fencehttp.HeaderToken, fencehttp.HeaderClaim
	cases := []struct {
		name   string
		path   string
		hdr    []string // header, value pairs, added in order
		inBody string
	}{
		{"true", "/", []string{L, "files", T, "9", C, "true"}, `Leasefence-Claim \"true\"`},
		{"zero", "/", []string{L, "files", T, "9", C, "0"}, `Leasefence-Claim \"0\"`},
		{"empty", "/", []string{L, "files", T, "9", C, ""}, `Leasefence-Claim \"\"`},
		{"list in one line", "/", []string{L, "files", T, "9", C, "1, 1"}, `Leasefence-Claim \"1, 1\"`},
		{"repeated", "/", []string{L, "files", T, "9", C, "1", C, "1"}, "Leasefence-Claim given 2 times"},
		{"no fencing headers", "/", []string{C, "1"}, "Leasefence-Lock is missing"},
		{"no token", "/", []string{L, "files", C, "1"}, "Leasefence-Token is missing"},
		{"wrong lock", "/", []string{L, "other", T, "9", C, "1"}, `fenced by \"files\"`},
		{"unfenced resource", "/open", []string{L, "files", T, "9", C, "1"}, "does not fence"},
	}
	lockOf := func(r *http.Request) string {
		if r.URL.Path == "/open" {
			return ""
		}
		return "files"
	}
	for kind, mk := range fixtures() {
		t.Run(kind, func(t *testing.T) {
			fx := mk(t)
			p := &probe{fx: fx, lock: "files"}
			srv := serve(t, fx.store, p, fencehttp.WithLockNameFunc(lockOf))
			if resp, _ := send(t, http.MethodGet, srv.URL, "", fencehttp.AttachClaim, fixedHolder{"files", 4}); resp.StatusCode != http.StatusOK {
				t.Fatalf("valid claim: %d", resp.StatusCode)
			}
			for _, tc := range cases {
				for _, method := range []string{http.MethodGet, http.MethodPut} {
					req, _ := http.NewRequestWithContext(etcdproc.Ctx(t, 30*time.Second), method, srv.URL+tc.path, strings.NewReader("bad"))
					for i := 0; i < len(tc.hdr); i += 2 {
						req.Header.Add(tc.hdr[i], tc.hdr[i+1])
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.inBody) {
						t.Errorf("%s %s: %d %s, want 400 mentioning %q", method, tc.name, resp.StatusCode, b, tc.inBody)
					}
				}
			}
			if runs, _, _ := p.last(); runs != 1 {
				t.Errorf("the handler ran %d times: a bad claim got through", runs-1)
			}
			if h := fx.highestOf(t, "files"); h != 4 {
				t.Errorf("record = %d after bad claims, want 4", h)
			}
			// The unfenced resource still serves plain requests.
			if resp, _ := send(t, http.MethodGet, srv.URL+"/open", "", fencehttp.Attach, fixedHolder{"files", 9}); resp.StatusCode != http.StatusOK {
				t.Errorf("plain GET of the unfenced resource: %d", resp.StatusCode)
			}
		})
	}
}

// A claim below the record is refused like any stale request: 409, which
// CheckResponse turns into a *fence.StaleError, and the handler's read does
// not run. A claim at the record's token passes (a holder may claim again),
// and a higher one raises it.
func TestStaleClaim(t *testing.T) {
	etcdproc.LeakCheck(t)
	steps := []struct {
		token   int64
		status  int
		highest int64 // the record afterwards; on a 409, the one named
	}{
		{6, http.StatusOK, 6},
		{3, http.StatusConflict, 6},
		{6, http.StatusOK, 6},
		{8, http.StatusOK, 8},
		{6, http.StatusConflict, 8},
	}
	for kind, mk := range fixtures() {
		t.Run(kind, func(t *testing.T) {
			fx := mk(t)
			name := etcdproc.Name(t, "files")
			p := &probe{fx: fx, lock: name}
			srv := serve(t, fx.store, p, fencehttp.WithLockName(name))
			wantRuns := 0
			for _, st := range steps {
				resp, _ := send(t, http.MethodGet, srv.URL, "", fencehttp.AttachClaim, fixedHolder{name, st.token})
				if resp.StatusCode != st.status {
					t.Fatalf("claim %d: status %d, want %d", st.token, resp.StatusCode, st.status)
				}
				var want fence.StaleError // none for a claim that passed
				if st.status == http.StatusOK {
					wantRuns++
				} else {
					want = fence.StaleError{Key: name, Token: st.token, Highest: st.highest}
				}
				if got := staleOf(t, resp); got != want {
					t.Errorf("claim %d: CheckResponse gave %+v, want %+v", st.token, got, want)
				}
				if runs, _, _ := p.last(); runs != wantRuns {
					t.Errorf("claim %d: handler runs %d, want %d", st.token, runs, wantRuns)
				}
				if h := fx.highestOf(t, name); h != st.highest {
					t.Errorf("claim %d: record %d, want %d", st.token, h, st.highest)
				}
			}
		})
	}
}

// endedHolder is a holding that has ended, as a lost *lease.Lock reports.
type endedHolder struct {
	fixedHolder
	err error
}

func (h endedHolder) Err() error { return h.err }

// AttachClaim sets the two fencing headers and the claim, or, when Attach
// would fail, fails the same way and sets nothing. Attach alone never
// claims.
func TestAttachClaim(t *testing.T) {
	etcdproc.LeakCheck(t)
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	if err := fencehttp.Attach(req, fixedHolder{"jobs", 42}); err != nil || req.Header.Get(fencehttp.HeaderClaim) != "" {
		t.Fatalf("Attach: %v, claim header %q", err, req.Header.Get(fencehttp.HeaderClaim))
	}
	req, _ = http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
	if err := fencehttp.AttachClaim(req, fixedHolder{"jobs", 42}); err != nil {
		t.Fatal(err)
	}
	want := http.Header{fencehttp.HeaderLock: {"jobs"}, fencehttp.HeaderToken: {"42"}, fencehttp.HeaderClaim: {"1"}}
	if len(req.Header) != len(want) {
		t.Errorf("headers %v, want %v", req.Header, want)
	}
	for k, v := range want {
		if got := req.Header.Values(k); len(got) != 1 || got[0] != v[0] {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}

	cases := []struct {
		name string
		h    fence.Holder
		is   error
	}{
		{"nil holder", nil, fence.ErrInvalidArgument},
		{"ended holder", endedHolder{fixedHolder{"jobs", 42}, lease.ErrLost}, lease.ErrLost},
		{"zero token", fixedHolder{"jobs", 0}, fence.ErrInvalidArgument},
		{"empty name", fixedHolder{"", 42}, fence.ErrInvalidArgument},
	}
	for _, tc := range cases {
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		err := fencehttp.AttachClaim(req, tc.h)
		if !errors.Is(err, tc.is) || !strings.HasPrefix(err.Error(), "fencehttp: ") {
			t.Errorf("%s: %v, want an error wrapping %v", tc.name, err, tc.is)
		}
		if len(req.Header) != 0 {
			t.Errorf("%s: a failed AttachClaim set %v", tc.name, req.Header)
		}
	}
}
