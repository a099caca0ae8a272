// Package readmecheck holds a test that keeps the README's Go samples
// compiling: each must be copied from a runnable example in an
// example_test.go, which the compiler checks.
package readmecheck
