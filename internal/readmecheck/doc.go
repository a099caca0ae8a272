// Package readmecheck holds a test that keeps the Go samples of the
// project's Markdown (README.md, CONTRIBUTING.md and docs/*.md) compiling:
// each must be copied from a runnable example in an example_test.go, which
// the compiler checks.
package readmecheck
