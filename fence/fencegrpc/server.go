package fencegrpc

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// Checker checks the fencing metadata of calls against a Store before they
// reach the handler. Its interceptors go on the server with
// grpc.ChainUnaryInterceptor and grpc.ChainStreamInterceptor. It is safe
// for concurrent use.
type Checker struct {
	store  fencestore.Store
	opts   options
	verify func(context.Context, fencestore.Claim) error // nil: tokens are not verified
}

// NewChecker returns a Checker over store. A lock name option is required:
// the server, not the client, decides which lock fences what.
func NewChecker(store fencestore.Store, opts ...Option) (*Checker, error) {
	if store == nil {
		return nil, fmt.Errorf("fencegrpc: %w: nil Store", fence.ErrInvalidArgument)
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	verify, err := fencestore.VerifyFunc(store, o.verifier)
	if err != nil {
		return nil, fmt.Errorf("fencegrpc: %w", err)
	}
	return &Checker{store: store, opts: o, verify: verify}, nil
}

type claimKey struct{}

// ClaimFrom returns the claim the Checker accepted for the call whose
// context ctx is.
func ClaimFrom(ctx context.Context) (fencestore.Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(fencestore.Claim)
	return c, ok
}

// UnaryServerInterceptor checks each unary call before its handler runs. A
// checked call reaches the handler only with both metadata keys well
// formed, the lock name the server expects, and a token the Store accepted
// (which it then records; with WithCheckInHandler the handler's write does
// this). A call carrying MetadataClaim is always checked, and its token
// recorded before the handler runs, whatever its method and even with
// WithCheckInHandler; a claim on a call the server does not fence is
// refused. Otherwise the call fails as Error says, and the handler does
// not run.
func (c *Checker) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := c.check(ctx, info.FullMethod, req)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor checks each stream once, when it opens, as
// UnaryServerInterceptor checks a unary call; the lock name function sees a
// nil request. Messages on a stream that passed are not checked again: a
// handler whose writes must stop once a higher token is accepted makes
// them through the Store's atomic step (fencestore.MemoryStore.Do, or a
// fence.Txn guarded by fencestore.EtcdStore.Guard) with the claim from
// ClaimFrom.
func (c *Checker) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := c.check(ss.Context(), info.FullMethod, nil)
		if err != nil {
			return err
		}
		return handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
	}
}

// serverStream carries the context with the accepted claim to the handler.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// check decides whether a call is fenced and, if it is, whether it may
// pass, returning the context the handler gets. The claim key is read
// first: a malformed one must not turn a claim into an unchecked read that
// the client believes protected.
func (c *Checker) check(ctx context.Context, method string, req any) (context.Context, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	claim, err := claimed(md)
	if err != nil {
		c.opts.hooks.Checked(ctx, "grpc", fence.RequestGuard("", 0, true), err)
		return nil, c.refuse(ctx, method, fencestore.Claim{}, err)
	}
	cl, fenced, err := fencestore.Check(ctx, c.store, fencestore.Request{
		Claim:     claim,
		Unchecked: c.opts.unchecked[method],
		Lock:      func() string { return c.opts.lockName(ctx, method, req) },
		Read:      func() (fencestore.Claim, error) { return ParseMetadata(md) },
		InHandler: c.opts.inHandler,
		ClaimKey:  MetadataClaim,
		Bad:       func(reason string) error { return fmt.Errorf("%w: %s", ErrBadMetadata, reason) },
		Verify:    c.verify,
	})
	if fenced || err != nil {
		c.opts.hooks.Checked(ctx, "grpc", fence.RequestGuard(cl.Name, cl.Token, claim), err)
	}
	switch {
	case err != nil:
		return nil, c.refuse(ctx, method, cl, err)
	case !fenced:
		return ctx, nil
	}
	return context.WithValue(ctx, claimKey{}, cl), nil
}

func (c *Checker) refuse(ctx context.Context, method string, cl fencestore.Claim, err error) error {
	if errors.Is(err, fence.ErrStale) || errors.Is(err, fence.ErrUnverified) {
		c.opts.hooks.Report("grpc", err)
	}
	st := Error(cl, err)
	if errors.Is(err, fence.ErrOutcomeUnknown) {
		// Before the handler: a check whose outcome is unknown wrote
		// nothing but the record, which a retry may raise again.
		st = status.Error(codes.Unavailable, err.Error())
	}
	lg := c.opts.lg.With(zap.String("method", method), zap.Stringer("code", status.Code(st)), zap.Error(err))
	if status.Code(st) == codes.Unavailable && ctx.Err() == nil {
		lg.Warn("fence store failed")
	} else {
		lg.Debug("call refused")
	}
	return st
}
