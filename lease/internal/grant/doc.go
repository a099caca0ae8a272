// Package grant asks etcd for a session's lease, failing at once on a
// certificate failure rather than waiting out the caller's context, and
// reporting a grant that goes unanswered.
package grant
