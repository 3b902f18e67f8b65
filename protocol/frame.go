package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxPayload is the largest BSON document a frame may carry, in either direction.
const MaxPayload = 64 << 20

// headerLen is the length prefix's size.
const headerLen = 4

var (
	// ErrTruncated is a peer that closed inside a frame: corruption, not an ending.
	ErrTruncated = errors.New("protocol: stream ended inside a frame")
	// ErrEmptyFrame is a frame of length zero, which no message serialises to.
	ErrEmptyFrame = errors.New("protocol: zero-length frame")
	// ErrFrameTooLarge is a frame longer than MaxPayload; it is refused, not allocated.
	ErrFrameTooLarge = errors.New("protocol: frame larger than 64 MiB")
)

// FrameReader reads frames from a stream. It is not safe for concurrent use.
type FrameReader struct {
	r       *bufio.Reader
	hdr     [headerLen]byte
	recycle *Recycler
}

// Recycle makes the reader take frame buffers from r when one is large enough; the
// caller hands each frame back with r.Put once it is done with it.
func (fr *FrameReader) Recycle(r *Recycler) { fr.recycle = r }

// NewFrameReader buffers r and reads frames from it.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// ReadFrame returns the next frame's BSON document, in a buffer of its own that the caller
// may keep. It returns io.EOF when the peer closed between frames, ErrTruncated when it
// closed inside one, and ErrEmptyFrame or ErrFrameTooLarge (wrapped, with the length) for
// a header no frame may carry; after any error the stream is not resynchronised.
func (fr *FrameReader) ReadFrame() ([]byte, error) {
	return readFrame(fr.r, fr.hdr[:], fr.recycle)
}

// ReadFrame reads one frame from r without buffering (see FrameReader.ReadFrame).
func ReadFrame(r io.Reader) ([]byte, error) {
	var hdr [headerLen]byte
	return readFrame(r, hdr[:], nil)
}

func readFrame(r io.Reader, hdr []byte, recycle *Recycler) ([]byte, error) {
	n, err := io.ReadFull(r, hdr)
	switch {
	case err == io.EOF && n == 0:
		return nil, io.EOF
	case err == io.ErrUnexpectedEOF:
		return nil, ErrTruncated
	case err != nil:
		return nil, err
	}
	size := binary.BigEndian.Uint32(hdr)
	if size == 0 {
		return nil, ErrEmptyFrame
	}
	if size > MaxPayload {
		return nil, fmt.Errorf("%w: header says %d bytes", ErrFrameTooLarge, size)
	}
	// The body is read into a buffer that grows as bytes arrive rather than one of the
	// header's size up front: a header alone (4 bytes a peer can send and then stall or
	// close after) must not cost 64 MiB. The buffer doubles while little has arrived,
	// and once a fair share of the frame has (1/earnedShare), the rest is allocated at
	// once — so what is allocated stays within a small multiple of what was supplied
	// (about earnedShare+4 times, plus firstChunk), while an honest large frame costs
	// about 1.5 times its size in allocation rather than 3, and is copied half a time
	// rather than twice. The frame returned has exactly its own length and capacity.
	total := int(size)
	if buf := recycle.take(total); buf != nil {
		if _, err := io.ReadFull(r, buf); err != nil {
			recycle.Put(buf)
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil, ErrTruncated
			}
			return nil, err
		}
		return buf, nil
	}
	buf := make([]byte, min(total, firstChunk))
	for n := 0; ; {
		m, err := io.ReadFull(r, buf[n:])
		n += m
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return nil, ErrTruncated
			}
			return nil, err
		}
		if n == total {
			return buf, nil
		}
		grow := 2 * len(buf)
		if total <= earnedShare*n {
			grow = total
		}
		next := make([]byte, min(total, grow))
		copy(next, buf)
		buf = next
	}
}

const (
	// firstChunk is how much of a frame's body is allocated before any of it has arrived.
	firstChunk = 64 << 10
	// earnedShare: once 1/earnedShare of a frame's body has arrived, the whole of it is
	// allocated. At 64 an honest 16 MiB frame costs about 0.5 MiB of extra copying (at 8
	// it was 4 MiB, and a visible share of the 64 MiB read/write benchmarks), while a peer
	// still has to send a sixty-fourth of whatever it makes this end allocate.
	earnedShare = 64
)

// WriteFrame writes doc as one frame, in a single Write of header and body.
func WriteFrame(w io.Writer, doc []byte) error {
	if len(doc) == 0 {
		return ErrEmptyFrame
	}
	if len(doc) > MaxPayload {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(doc))
	}
	buf := make([]byte, headerLen, headerLen+len(doc))
	binary.BigEndian.PutUint32(buf, uint32(len(doc)))
	_, err := w.Write(append(buf, doc...))
	return err
}

// WriteFramed writes a buffer that already begins with a reserved 4-byte header (as the
// Append* message builders produce when given NewFrameBuffer's slice): the header is
// filled in and the whole buffer is written at once, without copying the document.
func WriteFramed(w io.Writer, framed []byte) error {
	n := len(framed) - headerLen
	if n <= 0 {
		return ErrEmptyFrame
	}
	if n > MaxPayload {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	binary.BigEndian.PutUint32(framed, uint32(n))
	_, err := w.Write(framed)
	return err
}

// NewFrameBuffer returns a buffer with room for a frame header, to append one message to
// and hand to WriteFramed. sizeHint is the expected document size.
func NewFrameBuffer(sizeHint int) []byte {
	return make([]byte, headerLen, headerLen+sizeHint)
}
