package sandbox

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/linux"
)

// What the server and a sandbox's init say to each other on the socketpair (fd 3 in the
// init) before the relay starts on the same stream: the server sends a bootConfig frame,
// then, with a new upper, the snapshot's bytes; init answers with a bootStatus frame,
// carrying the new upper filesystem's descriptor (SCM_RIGHTS) when it made one. A frame
// is a 4-byte big-endian length and that many bytes of JSON.

// bootConfig is one boot, as the server describes it to init.
type bootConfig struct {
	Overlays []overlay  `json:"overlays"` // "/" first, then in mount order
	Trees    []treeSpec `json:"trees"`    // in the order init gave them
	Env      []string   `json:"env"`      // every command's environment
	ReadOnly []string   `json:"read_only"`
	// NewUpper is the size in bytes of the upper filesystem to make; 0 means the
	// session's upper comes with this frame (SCM_RIGHTS).
	NewUpper int64 `json:"new_upper"`
	// Snapshot is the length of the layer tar that follows this frame, applied to a new
	// upper before anything is mounted over it.
	Snapshot int64 `json:"snapshot"`
	// Rootless: init runs in a user namespace of its own, as the server's user.
	Rootless bool `json:"rootless"`
	// ResolvConf, when set, is the session's /etc/resolv.conf (network:true: it names the
	// user-space stack's resolver), a file on a tmpfs of its own bound over the image's.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// LoopbackOnly: network false; init refuses to boot if its namespace has any
	// interface but lo.
	LoopbackOnly bool `json:"loopback_only,omitempty"`
	// Devices are host device nodes bound into /dev (gpu:true: the NVIDIA devices).
	Devices []string `json:"devices,omitempty"`
	// Workdir, when set, is made (with its parents) in the new root if it is missing: an
	// image's working directory (see image_linux.go).
	Workdir string `json:"workdir,omitempty"`
}

// overlay is one overlayfs mount of a boot: Lowers (topmost first) at Target in the
// sandbox. Its upper directory is upper/TARGET in the session's upper filesystem — so the
// uppers of all of a boot's overlays nest into one tree, upper/, which alone is the
// session's change — and its work directory is work/SUB. Lowers are a list so that an
// image's layers (issue 4) are one overlay at "/" with the layers as its lowers.
type overlay struct {
	Target string   `json:"target"`
	Lowers []string `json:"lowers"`
	Sub    string   `json:"sub"`
	// Layers: Lowers are an OCI image's unpacked layers (the store's, whose opaque
	// directories carry trusted.overlay.opaque), stacked first in a read-only overlay of
	// their own that is this overlay's one lower (see imageLower).
	Layers bool `json:"layers,omitempty"`
}

// treeSpec is one file:// tree.
type treeSpec struct {
	N        int    `json:"n"` // its place in init's mounts, from 1, for messages
	URL      string `json:"url"`
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"ro"`
}

// bootStatus is init's answer: nothing in Err means it is ready to serve.
type bootStatus struct {
	Err   string `json:"err,omitempty"`
	Mount bool   `json:"mount,omitempty"` // Err is about a tree (MOUNT_FAILED)
}

// maxBootFrame bounds a config or status frame.
const maxBootFrame = 1 << 20

func appendFrame(v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	return append(out, body...), nil
}

// recvFrame reads a frame from a Unix socket with up to maxFds descriptors that came with
// its first bytes (SCM_RIGHTS); the caller owns them, also on error.
func recvFrame(c *net.UnixConn, v any, maxFds int) ([]int, error) {
	var fds []int
	var head [4]byte
	got := 0
	for got < len(head) {
		n, f, err := linux.RecvFds(c, head[got:], maxFds)
		fds = append(fds, f...)
		if err != nil {
			return fds, err
		}
		if n == 0 {
			return fds, io.ErrUnexpectedEOF
		}
		got += n
	}
	return fds, readFrame(io.MultiReader(bytes.NewReader(head[:]), c), v)
}

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func readFrame(r io.Reader, v any) error {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n > maxBootFrame {
		return fmt.Errorf("boot frame of %d bytes", n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	return json.Unmarshal(body, v)
}
