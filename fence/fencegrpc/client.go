package fencegrpc

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// CallOption says which holding a call is made under. It is a grpc.CallOption:
// give it per call to a client stub, or to a client interceptor's constructor
// as the default for every call of the connection. The client interceptors
// consume it. A call that reaches the transport still carrying one (the
// connection has no fencegrpc interceptor for its kind, unary or stream) fails
// with Internal before anything is sent: sent bare, a claim on a method the
// server does not check would pass unrecorded.
type CallOption struct {
	// The per-RPC credentials are how a call without the interceptor
	// fails: gRPC asks them for metadata before sending, and they refuse.
	grpc.PerRPCCredsCallOption
	apply func(*call)
}

// noInterceptor is the credentials of a CallOption that reached gRPC.
type noInterceptor struct{}

func (noInterceptor) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return nil, status.Error(codes.Internal, "fencegrpc: a fencing call option reached gRPC: the connection has no fencegrpc client interceptor for this kind of call")
}

func (noInterceptor) RequireTransportSecurity() bool { return false }

func option(apply func(*call)) CallOption {
	return CallOption{PerRPCCredsCallOption: grpc.PerRPCCredsCallOption{Creds: noInterceptor{}}, apply: apply}
}

type call struct {
	holder fence.Holder
	set    bool // holder given, possibly nil (refused then)
	claim  bool
	strip  bool // WithoutHolder: send no fencing metadata at all
}

// WithHolder makes the call carry h's lock name and token. A call for a holder
// already known to have ended (fence.Ended) fails with an error wrapping
// fence.ErrNotHeld and its Err, with code FailedPrecondition, and nothing is
// sent: an early warning, since the server's check is what protects the
// resource. A nil holder, or one whose name or token cannot be sent, fails
// with code InvalidArgument (fence.ErrInvalidArgument).
func WithHolder(h fence.Holder) CallOption {
	return option(func(c *call) { c.holder, c.set, c.strip = h, true, false })
}

// WithClaim makes the call a claim: the server records its token before the
// handler runs, whatever the method. A new holder claims before it first reads
// what the lock protects; a read with a claim is "claim, then read" in one
// round trip (the package documentation says what a claim guarantees). It
// needs a holder, from WithHolder here or as the interceptor's default.
func WithClaim() CallOption {
	return option(func(c *call) { c.claim = true })
}

// WithoutHolder sends the call with no fencing metadata, overriding the
// interceptor's default holder and removing the fencing keys (and any
// MetadataClaim) the context's outgoing metadata has: for the methods the
// server does not fence.
func WithoutHolder() CallOption {
	return option(func(c *call) { c.holder, c.set, c.claim, c.strip = nil, false, false, true })
}

// UnaryClientInterceptor attaches fencing metadata to unary calls, from the
// CallOptions given here (defaults for every call) and per call (which
// override them). A call with a holder carries its metadata, replacing any
// MetadataLock and MetadataToken the context's outgoing metadata has; a
// MetadataClaim there is sent as it is, so that "1" makes the call a claim as
// WithClaim does (and anything else is refused by the server). A call with no
// holder is sent as it is. A stale refusal comes back as an error that
// errors.As turns into a *fence.StaleError (errors.Is fence.ErrStale) naming
// both tokens, and that is still the server's status for status.FromError and
// status.Code.
func UnaryClientInterceptor(defaults ...CallOption) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, rest, err := outgoing(ctx, defaults, opts)
		if err != nil {
			return err
		}
		return clientError(invoker(ctx, method, req, reply, cc, rest...))
	}
}

// StreamClientInterceptor attaches fencing metadata to streams when they open,
// as UnaryClientInterceptor does to unary calls, and maps a stale refusal the
// same way wherever the stream returns it.
func StreamClientInterceptor(defaults ...CallOption) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, rest, err := outgoing(ctx, defaults, opts)
		if err != nil {
			return nil, err
		}
		cs, err := streamer(ctx, desc, cc, method, rest...)
		if err != nil {
			return nil, clientError(err)
		}
		return &clientStream{ClientStream: cs}, nil
	}
}

// clientStream maps the errors a stream returns: the server's refusal comes
// back from RecvMsg (or Header), not from opening the stream.
type clientStream struct{ grpc.ClientStream }

func (s *clientStream) RecvMsg(m any) error { return clientError(s.ClientStream.RecvMsg(m)) }

func (s *clientStream) Header() (metadata.MD, error) {
	md, err := s.ClientStream.Header()
	return md, clientError(err)
}

// appliedKey marks a call whose fencing options an interceptor applied.
type appliedKey struct{}

// outgoing applies the call options and returns the context to send with, and
// the options that are not this package's.
func outgoing(ctx context.Context, defaults []CallOption, opts []grpc.CallOption) (context.Context, []grpc.CallOption, error) {
	if ctx.Value(appliedKey{}) != nil {
		// An outer fencegrpc interceptor has applied the call options
		// (and consumed them): its holder, not this one's default.
		return ctx, opts, nil
	}
	ctx = context.WithValue(ctx, appliedKey{}, true)
	var c call
	for _, o := range defaults {
		if o.apply != nil {
			o.apply(&c)
		}
	}
	rest := opts[:0:0]
	for _, o := range opts {
		if co, ok := o.(CallOption); ok {
			if co.apply != nil {
				co.apply(&c)
			}
			continue
		}
		rest = append(rest, o)
	}
	switch {
	case !c.set && c.claim:
		return nil, nil, localError(codes.InvalidArgument, fmt.Errorf("fencegrpc: %w: a claim with no holder: give WithHolder", fence.ErrInvalidArgument))
	case !c.set && !c.strip:
		return ctx, rest, nil
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	delete(md, MetadataLock)
	delete(md, MetadataToken)
	if !c.set {
		delete(md, MetadataClaim)
		return metadata.NewOutgoingContext(ctx, md), rest, nil
	}
	// A claim marker the caller put in the metadata is kept, as the server
	// reads it (strictly): dropped, it would turn a claim into a plain
	// read that the caller believes protected.
	cl, err := claimOf(c.holder)
	if err != nil {
		return nil, nil, err
	}
	SetMetadata(md, cl)
	if c.claim {
		md.Set(MetadataClaim, "1")
	}
	return metadata.NewOutgoingContext(ctx, md), rest, nil
}

func claimOf(h fence.Holder) (fencestore.Claim, error) {
	cl, err := fencestore.ClaimOf(h)
	if err == nil {
		if err = checkName(cl.Name); err != nil {
			err = fmt.Errorf("%w: lock %w", fence.ErrInvalidArgument, err)
		}
	}
	switch {
	case err == nil:
		return cl, nil
	case errors.Is(err, fence.ErrNotHeld):
		return cl, localError(codes.FailedPrecondition, fmt.Errorf("fencegrpc: %w", err))
	}
	return cl, localError(codes.InvalidArgument, fmt.Errorf("fencegrpc: %w", err))
}

// localError is a refusal made before sending: a fence error that is also a
// status with code.
func localError(code codes.Code, err error) error {
	return &callError{err: err, st: status.New(code, err.Error())}
}
