// Package protocol is the Headless Console Protocol on the wire: length-prefixed BSON
// documents carrying JSON-RPC 2.0 objects, the typed parameters and results of its twelve
// methods, its error codes, and the mount and port syntax a session is declared with.
//
// The layers, from the bytes up:
//
//   - Framing ([ReadFrame], [WriteFrame], [FrameReader]): `[u32 big-endian length][BSON
//     document]`, at most [MaxPayload] bytes, never zero. A peer that closes between frames
//     ends cleanly ([io.EOF]); one that closes inside a frame is [ErrTruncated].
//   - Messages ([Decode], [AppendRequest], [AppendResult], [AppendError], …): the three
//     JSON-RPC shapes, told apart by which members are present exactly as PROTOCOL.md's
//     "What is refused when reading" lists. A refusal is an [*Error] with the code a server
//     answers with, and the request id when one could be read.
//   - Methods (the *Params and *Result types): each knows how to append itself as BSON and
//     how to read itself back, accepting Int32 or Int64 for every integer, and Binary or an
//     array of small integers for every byte field (the upstream client may send init's
//     snapshot as the latter; accepting it everywhere costs nothing), ignoring unknown
//     members. One refusal goes beyond the spec's list: `timeout_ms: 0` is -32602, since a
//     kill before the command starts is never what a caller meant (leave it out for none).
//   - [Mount] and [Port]: the strings `URL:GUEST[:ro|rw]…` (read from the right) and
//     `HOST:GUEST`.
//
// The encoder is written over bsoncore (go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore)
// rather than reflection-based bson.Marshal: a result carrying tens of MiB of output is then
// copied exactly once, into the frame, and a decoded Binary aliases the frame it came in.
// The shapes are fixed by the wire contract, so hand-written appenders cost little and are
// checked byte for byte by the tests.
package protocol
