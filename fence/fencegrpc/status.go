package fencegrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leasefence/leasefence/fence"
	"github.com/leasefence/leasefence/fence/fencestore"
)

// The ErrorInfo detail of a stale refusal: its Domain and Reason, and the
// keys of its Metadata.
const (
	ErrorDomain = "leasefence"
	ReasonStale = "STALE_FENCING_TOKEN"
	InfoLock    = "lock"
	InfoToken   = "token"
	InfoHighest = "highest"
	// ReasonUnverified is the Reason of a refusal of a token etcd did not
	// confirm (WithVerifier), and InfoRevision the key of etcd's revision
	// in its Metadata.
	ReasonUnverified = "UNVERIFIED_FENCING_TOKEN"
	InfoRevision     = "revision"
)

// Error is the status error answering a call under claim c that failed
// with err, as the server interceptors answer: Aborted for a
// *fence.StaleError, with an errdetails.ErrorInfo naming the lock, the
// token offered and the highest accepted (c's, or the error's if c is
// zero); PermissionDenied for a *fence.UnverifiedError, with an
// ErrorInfo naming the lock, the token and etcd's revision; Unavailable
// for fencestore.ErrVerifierUnavailable; Internal for fence.ErrBadRecord; InvalidArgument for
// ErrBadMetadata or fence.ErrInvalidArgument; Unknown for
// fence.ErrOutcomeUnknown, since the write may have been applied and a
// retry policy must not send it again; Canceled or DeadlineExceeded for
// the call's own context; Unavailable otherwise (the Store could not
// answer). Handlers return it when their own fenced write is refused.
func Error(c fencestore.Claim, err error) error {
	var se *fence.StaleError
	var ue *fence.UnverifiedError
	switch {
	case errors.As(err, &se):
		if c == (fencestore.Claim{}) {
			c = fencestore.Claim{Name: se.Key, Token: se.Token}
		}
		return staleStatus(c, se.Highest).Err()
	case errors.As(err, &ue):
		return unverifiedStatus(ue).Err()
	case errors.Is(err, fencestore.ErrVerifierUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, fence.ErrBadRecord):
		// A record something else wrote: no retry will fix it.
		return status.Error(codes.Internal, err.Error())
	case errors.Is(err, ErrBadMetadata) || errors.Is(err, fence.ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fence.ErrOutcomeUnknown):
		return status.Error(codes.Unknown, err.Error())
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Unavailable, err.Error())
}

func staleStatus(c fencestore.Claim, highest int64) *status.Status {
	st := status.New(codes.Aborted, fmt.Sprintf("stale fencing token %d for lock %q: token %d already accepted", c.Token, c.Name, highest))
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Domain: ErrorDomain,
		Reason: ReasonStale,
		Metadata: map[string]string{
			InfoLock:    c.Name,
			InfoToken:   fencestore.FormatToken(c.Token),
			InfoHighest: fencestore.FormatToken(highest),
		},
	})
	if err != nil {
		return st // only a detail that cannot be marshalled fails, and this one can
	}
	return withInfo
}

func unverifiedStatus(e *fence.UnverifiedError) *status.Status {
	st := status.New(codes.PermissionDenied, e.Error())
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Domain: ErrorDomain,
		Reason: ReasonUnverified,
		Metadata: map[string]string{
			InfoLock:     e.Name,
			InfoToken:    fencestore.FormatToken(e.Token),
			InfoRevision: strconv.FormatInt(e.Revision, 10),
		},
	})
	if err != nil {
		return st
	}
	return withInfo
}

// UnverifiedFrom returns the *fence.UnverifiedError that a fencegrpc
// server's refusal of an unconfirmed token carries, and false for any
// other error, as StaleFrom does for stale ones.
func UnverifiedFrom(err error) (*fence.UnverifiedError, bool) {
	md, ok := infoOf(err, codes.PermissionDenied, ReasonUnverified)
	if !ok {
		return nil, false
	}
	token, err1 := fencestore.ParseToken(md[InfoToken])
	rev, err2 := strconv.ParseInt(md[InfoRevision], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return &fence.UnverifiedError{Name: md[InfoLock], Token: token, Revision: rev}, true
}

// infoOf is the Metadata of err's leasefence ErrorInfo with reason, if err
// is a status with code and such a detail.
func infoOf(err error, code codes.Code, reason string) (map[string]string, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		return nil, false
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if ok && info.GetDomain() == ErrorDomain && info.GetReason() == reason {
			return info.GetMetadata(), true
		}
	}
	return nil, false
}

// StaleFrom returns the *fence.StaleError that a stale refusal from a
// fencegrpc server carries, and false for any other error. The client
// interceptors already return errors that errors.As turns into one; this
// is for clients that call without them.
func StaleFrom(err error) (*fence.StaleError, bool) {
	md, ok := infoOf(err, codes.Aborted, ReasonStale)
	if !ok {
		return nil, false
	}
	token, err1 := fencestore.ParseToken(md[InfoToken])
	highest, err2 := fencestore.ParseToken(md[InfoHighest])
	if err1 != nil || err2 != nil {
		return nil, false
	}
	return &fence.StaleError{Key: md[InfoLock], Token: token, Highest: highest}, true
}

// callError is a client-side error that is both a fence error (errors.Is
// and errors.As reach err) and a gRPC status (status.FromError and
// status.Code read st).
type callError struct {
	err error
	st  *status.Status
}

func (e *callError) Error() string              { return e.err.Error() }
func (e *callError) Unwrap() error              { return e.err }
func (e *callError) GRPCStatus() *status.Status { return e.st }

// clientError maps a call's error: a stale refusal becomes a callError
// wrapping its *fence.StaleError, a refusal of an unconfirmed token one
// wrapping its *fence.UnverifiedError; anything else is returned as it is.
func clientError(err error) error {
	var fe error
	if se, ok := StaleFrom(err); ok {
		fe = se
	} else if ue, ok := UnverifiedFrom(err); ok {
		fe = ue
	} else {
		return err
	}
	st, _ := status.FromError(err)
	return &callError{err: fmt.Errorf("fencegrpc: %w", fe), st: st}
}
