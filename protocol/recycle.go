package protocol

import "sync"

// Recycler keeps a few large frame buffers for reuse, so that a peer moving a file in
// frames of tens of MiB does not allocate (and zero, and collect) a new buffer for each.
// It is for an end that knows when it is done with a frame — a server, once the request
// is answered — and is safe for concurrent use. Only buffers of at least recycleMin bytes
// are kept, at most recycleKeep of them.
//
// A FrameReader given a Recycler reads a frame straight into a kept buffer when one is
// large enough, which also skips the reader's guard against headers that claim more than
// their peer sends: that guard is about allocating, and nothing is allocated.
type Recycler struct {
	mu   sync.Mutex
	free [][]byte
}

const (
	recycleMin  = 1 << 20
	recycleKeep = 4
)

// take returns a kept buffer of length n, or nil when none is large enough.
func (r *Recycler) take(n int) []byte {
	if r == nil || n < recycleMin {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	best := -1
	for i, b := range r.free {
		if cap(b) >= n && (best < 0 || cap(b) < cap(r.free[best])) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := r.free[best]
	r.free = append(r.free[:best], r.free[best+1:]...)
	return b[:n]
}

// Put hands a buffer back once nothing refers to it any more (nor to any slice of it).
func (r *Recycler) Put(b []byte) {
	if r == nil || cap(b) < recycleMin {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.free) < recycleKeep {
		r.free = append(r.free, b[:0])
		return
	}
	smallest := 0
	for i, f := range r.free {
		if cap(f) < cap(r.free[smallest]) {
			smallest = i
		}
	}
	if cap(b) > cap(r.free[smallest]) {
		r.free[smallest] = b[:0]
	}
}

// FrameBuffer is NewFrameBuffer from kept buffers when one fits.
func (r *Recycler) FrameBuffer(sizeHint int) []byte {
	if b := r.take(headerLen + sizeHint); b != nil {
		return b[:headerLen]
	}
	return NewFrameBuffer(sizeHint)
}
