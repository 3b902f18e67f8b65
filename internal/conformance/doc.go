// Package conformance holds the protocol conformance suite: one table of protocol cases
// driven against the real `virtx serve` binary over stdio, for every backend. A case a
// backend cannot support is declared in that backend's entry (with the reason), never
// deleted from the table. The suite lives in this package's tests; run it with
//
//	go test ./internal/conformance/
//
// and pick backends with VIRTX_CONFORMANCE_BACKENDS (comma-separated; default all three:
// host, sandbox, vm — a backend whose prerequisites are missing skips locally, naming the
// package, and fails under CI=true).
package conformance
