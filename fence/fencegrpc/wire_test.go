package fencegrpc_test

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/leasefence/leasefence/fence/fencegrpc"
	"github.com/leasefence/leasefence/fence/fencestore"
	"github.com/leasefence/leasefence/internal/etcdproc"
)

// rawCall sends one EmptyCall as raw HTTP/2 frames with the header fields
// given, as no grpc-go client can (it refuses uppercase keys and control
// characters), and returns the grpc-status answered, or reset if the
// stream was reset instead.
func rawCall(t *testing.T, addr string, fields [][2]string) (status string, reset bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	head := [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", methodEmpty}, {":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}}
	for _, f := range append(head, fields...) {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true}); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}); err != nil { // an empty message
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			for _, hf := range f.Fields {
				if hf.Name == "grpc-status" {
					status = hf.Value
				}
			}
			if f.StreamEnded() {
				return status, false
			}
		case *http2.RSTStreamFrame, *http2.GoAwayFrame:
			return "", true
		}
	}
}

// A claim marker as it may arrive from clients that are not grpc-go, or
// through proxies: in uppercase (HTTP/2 forbids it; the stream is reset),
// joined by commas, padded with spaces or tabs, repeated, or empty. None
// of them reaches the handler of an unchecked method as a plain read, and
// the Store does not move; a well-formed claim is recorded.
func TestRawClaimMarkers(t *testing.T) {
	etcdproc.LeakCheck(t)
	keys := [][2]string{{"leasefence-lock", "ledger"}, {"leasefence-token", "4"}}
	with := func(extra ...[2]string) [][2]string { return append(append([][2]string(nil), keys...), extra...) }
	cases := []struct {
		name   string
		fields [][2]string
	}{
		{"uppercase key", with([2]string{"Leasefence-Claim", "1"})},
		{"joined", with([2]string{"leasefence-claim", "1,1"})},
		{"leading space", with([2]string{"leasefence-claim", " 1"})},
		{"trailing space", with([2]string{"leasefence-claim", "1 "})},
		{"tab", with([2]string{"leasefence-claim", "1\t"})},
		{"repeated", with([2]string{"leasefence-claim", "1"}, [2]string{"leasefence-claim", "1"})},
		{"empty", with([2]string{"leasefence-claim", ""})},
		{"joined tokens", [][2]string{{"leasefence-lock", "ledger"}, {"leasefence-token", "4,5"}, {"leasefence-claim", "1"}}},
		{"token with trailing space", [][2]string{{"leasefence-lock", "ledger"}, {"leasefence-token", "4 "}, {"leasefence-claim", "1"}}},
		{"non-ASCII lock", [][2]string{{"leasefence-lock", "ledgé"}, {"leasefence-token", "4"}, {"leasefence-claim", "1"}}},
		{"uppercase lock key", [][2]string{{"Leasefence-Lock", "ledger"}, {"leasefence-token", "4"}, {"leasefence-claim", "1"}}},
	}
	store := fencestore.NewMemoryStore()
	l := &ledger{}
	ck, err := fencegrpc.NewChecker(store, fencegrpc.WithLockName("ledger"), fencegrpc.WithUncheckedMethods(methodEmpty))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(ck.UnaryServerInterceptor()))
	testpb.RegisterTestServiceServer(srv, l)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	defer func() {
		srv.Stop()
		<-done
	}()
	addr := lis.Addr().String()
	for _, tc := range cases {
		status, reset := rawCall(t, addr, tc.fields)
		if !reset && status != "3" { // 3: InvalidArgument
			t.Errorf("%s: grpc-status %q, want InvalidArgument or a reset stream", tc.name, status)
		}
	}
	if _, calls := l.snapshot(); calls != 0 || store.Highest("ledger") != 0 {
		t.Fatalf("%d handler runs, highest %d: a malformed claim passed", calls, store.Highest("ledger"))
	}
	if status, reset := rawCall(t, addr, with([2]string{"leasefence-claim", "1"})); reset || status != "0" || store.Highest("ledger") != 4 {
		t.Fatalf("well-formed claim: grpc-status %q, reset %v, highest %d", status, reset, store.Highest("ledger"))
	}
}
