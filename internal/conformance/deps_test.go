package conformance

// The suite drives a binary it builds itself (TestMain), which go test's cache cannot
// see. Importing the command's packages makes the test binary depend on all of them, so a
// change anywhere in virtx invalidates a cached result instead of replaying a stale pass.
import _ "virtx.dev/virtx/internal/cli"
