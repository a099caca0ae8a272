// Package keyread holds the lock's reads that need at least a revision:
// ReadAtLeast, which lets the client's member answer when it can, and
// Batcher, which puts many held locks' reads of their own keys into one
// transaction.
package keyread
