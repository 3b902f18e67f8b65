package sandbox

import "io"

// startNetwork gives the sandbox whose init is pid its outbound network, for a session
// with network true; what it returns is closed when the sandbox is shut down.
//
// This is the seam for internal/network (pasta or slirp4netns, one per session): until it
// is wired here, a network:true session has what a network:false one has, loopback only,
// and the conformance target says so.
func startNetwork(pid int) (io.Closer, error) { return nil, nil }

// outboundNetwork says whether startNetwork gives a session more than loopback.
const outboundNetwork = false
