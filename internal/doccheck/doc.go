// Package doccheck holds a test that keeps unexported names out of the
// module's documentation: the package doc and the doc comments of exported
// declarations (and of their exported fields and methods) of every public
// package must not name an unexported identifier of that package, since a
// reader of the documentation cannot see it.
//
// A name counts when it appears as a whole word and looks like code: it has
// an uppercase letter or an underscore (mixedCaps, as Go spells names of
// more than one word), or it is written in backquotes, called (name(), or
// selected from an exported name (Lock.name). Plain lowercase words that
// happen to be identifiers too (a field named mu, a function named owns)
// count only in those three code-like forms, so prose is not flagged. A
// function's doc may name its own parameters and results, as Go's
// convention has it, even where a field shares the name.
package doccheck
