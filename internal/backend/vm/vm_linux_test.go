package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pierrec/lz4/v4"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// readCPIO parses a newc archive back into name → (mode, body).
func readCPIO(t *testing.T, b []byte) map[string][2]string {
	t.Helper()
	out := map[string][2]string{}
	for off := 0; ; {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+nameLen-1])
		off = (off + 110 + nameLen + 3) &^ 3
		body := string(b[off : off+size])
		off = (off + size + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("%d bytes after the trailer", len(b)-off)
			}
			return out
		}
		out[name] = [2]string{fmt.Sprintf("%o", mode), body}
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.Dir("dev", 0o755))
	must(w.File("/init", 0o755, []byte("abcde")))
	must(w.File("modules/x.ko", 0o644, nil))
	must(w.Symlink("bin", "usr/bin"))
	must(w.Close())
	if buf.Len()%4 != 0 {
		t.Fatalf("archive length %d is not 4-aligned", buf.Len())
	}
	got := readCPIO(t, buf.Bytes())
	want := map[string][2]string{
		"dev":          {"40755", ""},
		"init":         {"100755", "abcde"},
		"modules/x.ko": {"100644", ""},
		"bin":          {"120777", "usr/bin"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}

// fakeVmlinux is a minimal ELF64 with one PT_NOTE holding a Xen PHYS32_ENTRY note
// (when pvh), padded to size bytes.
func fakeVmlinux(pvh bool, size int) []byte {
	b := make([]byte, size)
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = 2, 1, 1 // 64-bit, little endian, version
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)  // version
	le.PutUint64(b[32:], 64) // phoff
	le.PutUint16(b[52:], 64) // ehsize
	le.PutUint16(b[54:], 56) // phentsize
	le.PutUint16(b[56:], 1)  // phnum
	le.PutUint16(b[58:], 64) // shentsize
	note := make([]byte, 0, 24)
	note = le.AppendUint32(note, 4) // namesz "Xen\0"
	note = le.AppendUint32(note, 4) // descsz
	typ := uint32(18)
	if !pvh {
		typ = 17
	}
	note = le.AppendUint32(note, typ)
	note = append(note, "Xen\x00"...)
	note = le.AppendUint32(note, 0x1000000)
	ph := b[64:]
	le.PutUint32(ph[0:], 4)                  // PT_NOTE
	le.PutUint64(ph[8:], 128)                // offset
	le.PutUint64(ph[32:], uint64(len(note))) // filesz
	le.PutUint64(ph[40:], uint64(len(note))) // memsz
	le.PutUint64(ph[48:], 4)                 // align
	copy(b[128:], note)
	for i := 128 + len(note); i < size; i++ {
		b[i] = byte(i * 7 % 251)
	}
	return b
}

// fakeBzImage wraps payload as an x86 boot image with its LZ4 legacy framing.
func fakeBzImage(t *testing.T, vmlinux []byte) []byte {
	var payload bytes.Buffer
	payload.Write([]byte{0x02, 0x21, 0x4c, 0x18})
	for off := 0; off < len(vmlinux); off += 8 << 20 {
		chunk := vmlinux[off:min(off+8<<20, len(vmlinux))]
		dst := make([]byte, lz4.CompressBlockBound(len(chunk)))
		n, err := lz4.CompressBlock(chunk, dst, nil)
		if err != nil || n == 0 {
			t.Fatalf("compress: %v (%d)", err, n)
		}
		binary.Write(&payload, binary.LittleEndian, uint32(n))
		payload.Write(dst[:n])
	}
	binary.Write(&payload, binary.LittleEndian, uint32(len(vmlinux)))
	const setupSects = 3
	img := make([]byte, (setupSects+1)*512+100)
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	binary.LittleEndian.PutUint32(img[0x248:], 100) // payload offset in the protected-mode part
	binary.LittleEndian.PutUint32(img[0x24c:], uint32(payload.Len()))
	return append(img, payload.Bytes()...)
}

func TestPVHVmlinux(t *testing.T) {
	elf := fakeVmlinux(true, 9<<20) // more than one 8 MiB LZ4 block
	got, err := PVHVmlinux(fakeBzImage(t, elf))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, elf) {
		t.Fatal("the extracted vmlinux differs")
	}
	if got, err := PVHVmlinux(elf); err != nil || !bytes.Equal(got, elf) {
		t.Fatalf("an ELF is taken as it is: %v", err)
	}
	if _, err := PVHVmlinux(fakeBzImage(t, fakeVmlinux(false, 4096))); err == nil || !strings.Contains(err.Error(), "PVH") {
		t.Fatalf("a kernel without the PVH note: %v", err)
	}
	if _, err := PVHVmlinux([]byte("not a kernel at all, not at all, not at all")); err == nil {
		t.Fatal("garbage accepted")
	}
}

// TestRealKernel extracts the cached cloud kernel when there is one (virtx setup vm).
func TestRealKernel(t *testing.T) {
	cache := os.Getenv("VIRTX_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "virtx")
	}
	k, err := cachedKernel(cache)
	if err != nil {
		t.Skipf("no provisioned kernel in %s (virtx setup vm): %v", cache, err)
	}
	b, err := os.ReadFile(k.Vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPVH(b); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for i, m := range k.Modules {
		names[filepath.Base(m)] = true
		for _, d := range k.ModuleDeps[i] {
			if !names[d] {
				t.Errorf("%s is loaded before its dependency %s", filepath.Base(m), d)
			}
		}
	}
	for _, want := range guestModules {
		if !names[want+".ko"] {
			t.Errorf("module %s not provisioned", want)
		}
	}
}

func TestAdmit(t *testing.T) {
	b := New(t.TempDir())
	ctx := context.Background()
	tr := true
	for _, c := range []struct {
		name string
		spec backend.Spec
		want error
	}{
		{"default", backend.Spec{Network: true}, nil},
		{"network off", backend.Spec{}, nil},
		{"shape", backend.Spec{VCPUs: 1, MemoryMiB: 512, DiskGiB: 1}, nil},
		// A digest the (empty) store lacks: no registry is asked.
		{"image", backend.Spec{Image: &protocol.ImageSource{Type: protocol.ImageDigest, Digest: "sha256:" + strings.Repeat("e", 64)}}, imageRefusal()},
		{"gpu", backend.Spec{GPU: &tr}, backend.ErrUnsupportedMachine},
		{"vcpus", backend.Spec{VCPUs: 100000}, backend.ErrUnsupportedMachine},
		{"memory too small", backend.Spec{MemoryMiB: 16}, backend.ErrUnsupportedMachine},
		{"memory too big", backend.Spec{MemoryMiB: 1 << 40}, backend.ErrUnsupportedMachine},
		{"disk too big", backend.Spec{DiskGiB: 1 << 40}, backend.ErrUnsupportedMachine},
		{"scheme", backend.Spec{Mounts: []protocol.Mount{{URL: "s3://b/k", GuestPath: "/x"}}}, backend.ErrUnsupportedMount},
		{"relative", backend.Spec{Mounts: []protocol.Mount{{URL: "file://host/x", GuestPath: "/x"}}}, backend.ErrUnsupportedMount},
	} {
		cwd, err := b.Admit(ctx, &c.spec)
		if c.want == nil && (err != nil || cwd != "/root") {
			t.Errorf("%s: %q %v", c.name, cwd, err)
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

func TestQEMUArgs(t *testing.T) {
	b := New(t.TempDir())
	a := &Assets{Kernel: &Kernel{Vmlinux: "/k/vmlinux"}, Initramfs: "/k/initrd"}
	args, err := b.qemuArgs(&backend.Spec{Network: true, VCPUs: 1, MemoryMiB: 768, Ports: []protocol.Port{{Host: 8080, Guest: 80}}}, a, "/run/x", "tcg", true)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(args, " ")
	for _, want := range []string{
		"-smp 1", "-m 768M", "memory-backend-memfd,id=mem,size=768M,share=on", "-accel tcg",
		"tap,id=net,ifname=tap0,script=no,downscript=no", "virtio-net-device,netdev=net",
		"-drive file=/dev/fd/4,format=raw,if=none,readonly=on,id=image", "virtio-blk-device,drive=image,serial=virtx-image",
		"virtio-mmio.force-legacy=false", "tsc=reliable", "no_timer_check", "-no-reboot",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("missing %q in %s", want, line)
		}
	}
	if strings.Contains(line, "hostfwd") || strings.Contains(line, "user,") {
		t.Errorf("QEMU's own user network is back: %s", line)
	}
	args, _ = b.qemuArgs(&backend.Spec{}, a, "/run/x", "tcg", false)
	line = strings.Join(args, " ")
	if strings.Contains(line, "netdev") || strings.Contains(line, "virtio-net") || strings.Contains(line, "virtx-image") {
		t.Fatalf("network off still has a NIC, or the host image an image disk: %s", line)
	}
	if !strings.Contains(line, fmt.Sprintf("-smp %d", DefaultVCPUs)) || !strings.Contains(line, fmt.Sprintf("-m %dM", DefaultMemoryMiB)) {
		t.Fatalf("defaults: %s", line)
	}
}

// TestReap checks the reaper: a run dir of a dead server goes, and a process its pids
// file names is killed only while it is the process recorded (same start time).
func TestReap(t *testing.T) {
	cache := t.TempDir()
	root := runRoot(cache)
	victim := exec.Command("sleep", "60")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	defer victim.Process.Kill()
	bystander := exec.Command("sleep", "60")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	defer bystander.Process.Kill()
	dead := filepath.Join(root, "999999999.1.1") // no such pid
	mine, err := newRunDir(cache)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dead, 0o700)
	if err := recordPid(dead, "qemu", victim.Process.Pid); err != nil {
		t.Fatal(err)
	}
	st, _ := procStart(bystander.Process.Pid)
	os.WriteFile(filepath.Join(dead, "pids"), append(must(os.ReadFile(filepath.Join(dead, "pids"))),
		fmt.Sprintf("virtiofsd %d %d\n", bystander.Process.Pid, st+1)...), 0o600)
	if n := reap(cache); n != 1 {
		t.Fatalf("reaped %d dirs, want 1", n)
	}
	if _, err := os.Stat(dead); err == nil {
		t.Fatal("the dead server's dir is still there")
	}
	if _, err := os.Stat(mine); err != nil {
		t.Fatal("the live server's dir was reaped")
	}
	done := make(chan error, 1)
	go func() { done <- victim.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the recorded process was not killed")
	}
	time.Sleep(100 * time.Millisecond)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", bystander.Process.Pid))
	if err != nil || strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))[0] == "Z" {
		t.Fatal("the process with another start time was killed")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// imageRefusal is the vm backend's answer to an image the store lacks: unknown as root,
// unsupported otherwise (the store's layers need root).
func imageRefusal() error {
	if os.Geteuid() != 0 {
		return backend.ErrUnsupportedImage
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return backend.ErrBootFailed // asked before the store: apt-get install erofs-utils
	}
	return backend.ErrUnknownImage
}

func TestStripSignature(t *testing.T) {
	body := []byte("\x7fELF module body")
	sig := bytes.Repeat([]byte{0xAB}, 681)
	trailer := []byte{0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0x02, 0xA9} // sig_len 681 big-endian
	signed := append(append(append(append([]byte(nil), body...), sig...), trailer...), moduleSigMagic...)
	if got := stripSignature(signed); !bytes.Equal(got, body) {
		t.Fatalf("stripped to %q", got)
	}
	if got := stripSignature(body); !bytes.Equal(got, body) {
		t.Fatalf("an unsigned module changed: %q", got)
	}
}
