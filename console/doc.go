// Package console is the Go client of the Headless Console Protocol: it opens a session on
// a console server and runs commands, reads and writes files, and takes snapshots in it.
//
// # A Console is one session on one server process
//
// [Open] starts the server (by default the installed one; see [WithServer]), sends `init`
// with everything the options said, and returns once the server has answered it. Every
// option is checked before anything is started or sent: a relative guest path, a bad port
// or a zero-sized machine is an error wrapping [ErrInvalidOption], and no process ever
// existed. [New] does the same over streams you already have (a pipe, a socket), with no
// process of its own.
//
//	c, err := console.Open(ctx,
//		console.WithReadOnlyMount("./project", "/work"),
//		console.WithMount(outDir, "/work/out"),
//		console.WithNetwork(false),
//	)
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	res, err := c.Exec(ctx, []string{"sh", "-c", "make && cp app out/"}, console.WithTimeout(time.Minute))
//
// The session's current directory is the server's to keep: [Console.Cwd] is where it
// started, an executed `cd` moves it, and `pwd` is how to ask where it is now.
//
// [Console.Close] sends `quit`, closes the server's stdin and waits for it to exit, killing
// it if it has not within ten seconds. Closing twice is closing once; every call after it
// fails with [ErrClosed].
//
// # One call outstanding at a time
//
// The protocol answers one request at a time, so a Console has at most one call on the
// wire. It is safe for concurrent use: calls made from several goroutines are serialised,
// each waiting for the one before it to be answered. Concurrency is across Consoles, one
// per session.
//
// Every call takes a context. Cancelling it returns ctx.Err() promptly, whether the call is
// still waiting its turn, being written, or waiting for its answer; an answer that arrives
// afterwards is recognised by its id and dropped. Cancelling does not stop the work on the
// far end: a command keeps running until it ends or its [WithTimeout] kills it, and the
// next call is answered after it.
//
// # Errors you can branch on
//
//   - [*RefusedError]: the server answered the call with an error. It carries the
//     protocol's code, so errors.Is(err, &protocol.Error{Code: protocol.CodeNotFound})
//     and protocol.CodeOf(err) both work. The session is fine; the next call may succeed.
//     A command that exits non-zero is not an error: it is an [protocol.ExecResult] whose
//     Code says so.
//   - [ErrBroken]: the channel or the server died, or the server broke the protocol (sent
//     a request, a frame that does not decode, or an answer typed for another method). The
//     error says what happened, with the server's exit status and the last line it wrote
//     to stderr when there is one. The Console is unusable; Close it.
//   - [ErrClosed]: the Console was closed.
//   - [ErrInvalidOption]: an option was refused before anything was sent.
//   - context.Canceled, context.DeadlineExceeded: the call's context ended first.
package console
