// Package rpcerr tells apart the etcd request failures that matter to
// leasefence: those etcd returns before applying anything (definite), and
// those after which the request may succeed if sent again (transient).
package rpcerr

import (
	"context"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// code is err's gRPC code; the client turns some statuses into
// rpctypes.EtcdError values.
func code(err error) codes.Code {
	var etcdErr rpctypes.EtcdError
	if errors.As(err, &etcdErr) {
		return etcdErr.Code()
	}
	return status.Code(err)
}

// Definite tells whether err means the request was refused before anything
// was applied: bad input, no permission, not authenticated. A deadline, a
// cancel or a lost connection is never definite: the request may have been
// applied.
func Definite(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated,
		codes.FailedPrecondition, codes.OutOfRange:
		return true
	case codes.ResourceExhausted:
		// etcd refuses a request too large (or too many) before applying
		// it; but the client also says ResourceExhausted when the answer
		// to a request etcd did apply is larger than it accepts.
		return !tooLargeAnswer(err)
	}
	return false
}

// tooLargeAnswer tells whether err is the client's refusal of an answer
// larger than its receive limit: the request reached etcd, and may have
// been applied.
func tooLargeAnswer(err error) bool {
	return strings.Contains(status.Convert(err).Message(), "received message larger than max")
}

// Refused tells whether err is a refusal that sending the request again
// will not change (no permission, bad input): definite, but not etcd's
// refusal while overloaded (too many requests, its space quota), after
// which the same request may be accepted. A write that must happen (a
// removal, a withdrawal) gives up only on these.
func Refused(err error) bool {
	return Definite(err) && code(err) != codes.ResourceExhausted
}

// Transient tells whether a failed request may succeed if sent again while
// ctx lasts: the connection dropped or the cluster had no leader for a
// moment.
func Transient(ctx context.Context, err error) bool {
	return ctx.Err() == nil && code(err) == codes.Unavailable
}

// WatchRefusal is the error of a watch that etcd cancelled for a reason
// that sending it again will not change (no permission, a bad token), or
// nil. The client hands such a cancellation on as a plain error carrying
// the text of etcd's gRPC error; it is matched back to etcd's error here.
func WatchRefusal(err error) error {
	if err == nil {
		return nil
	}
	for grpcErr, etcdErr := range map[error]error{
		rpctypes.ErrGRPCPermissionDenied: rpctypes.ErrPermissionDenied,
		rpctypes.ErrGRPCInvalidAuthToken: rpctypes.ErrInvalidAuthToken,
		rpctypes.ErrGRPCUserEmpty:        rpctypes.ErrUserEmpty,
		rpctypes.ErrGRPCAuthNotEnabled:   rpctypes.ErrAuthNotEnabled,
		rpctypes.ErrGRPCInvalidAuthMgmt:  rpctypes.ErrInvalidAuthMgmt,
	} {
		if err.Error() == grpcErr.Error() || errors.Is(err, etcdErr) {
			return etcdErr
		}
	}
	return nil
}
