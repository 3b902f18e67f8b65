package protocol

// envelopeRoom is generous room for a message's envelope and small members.
const envelopeRoom = 512

// SizeHint estimates the encoded size of a message carrying p, so that a frame buffer can
// be allocated once and a payload of tens of MiB is copied exactly once.
func SizeHint(p Payload) int {
	switch v := p.(type) {
	case *ExecResult:
		return envelopeRoom + len(v.Stdout) + len(v.Stderr)
	case *ReadResult:
		return envelopeRoom + len(v.Data)
	case *WriteParams:
		return envelopeRoom + len(v.Path) + len(v.Data)
	case *SnapshotResult:
		return envelopeRoom + len(v.Blob)
	case *InitParams:
		return envelopeRoom + len(v.Snapshot) + 256*len(v.Mounts)
	}
	return envelopeRoom
}
