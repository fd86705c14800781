// Package wording holds checks on the repository's own text (comments, docs, READMEs,
// file and folder names) that the Go tests run: see wording_test.go.
//
// The code speaks of the code: measurements are recorded in docs/perf/ and
// bench/results/<machine>-<date>-<commit>/, named by date and commit, and text refers to
// them that way, not by when or in which sitting they were made.
package wording
