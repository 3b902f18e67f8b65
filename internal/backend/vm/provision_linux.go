package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
)

// Assets are what a boot needs from the host: QEMU, virtiofsd, the kernel and the
// initramfs.
type Assets struct {
	QEMU      string
	Virtiofsd string
	MkfsExt4  string
	Kernel    *Kernel
	Initramfs string
}

// qemuPackage and friends name what to install when a tool is missing.
const (
	qemuPackage = "qemu-system-x86"
	fsdPath     = "/usr/lib/qemu/virtiofsd" // shipped by qemu-system-common (7.2)
)

// FindQEMU finds qemu-system-x86_64 and virtiofsd, or says which package brings them.
func FindQEMU() (qemu, fsd string, err error) {
	qemu, err = exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", "", fmt.Errorf("%w: qemu-system-x86_64 is not installed: run `apt-get install %s`", backend.ErrBootFailed, qemuPackage)
	}
	fsd = os.Getenv("VIRTX_VIRTIOFSD")
	if fsd == "" {
		fsd = fsdPath
		if _, err := os.Stat(fsd); err != nil {
			if p, err2 := exec.LookPath("virtiofsd"); err2 == nil {
				fsd = p
			} else {
				return "", "", fmt.Errorf("%w: virtiofsd is not at %s: run `apt-get install %s` (it ships in qemu-system-common), or set VIRTX_VIRTIOFSD", backend.ErrBootFailed, fsdPath, qemuPackage)
			}
		}
	}
	return qemu, fsd, nil
}

// provisioner remembers what was provisioned in this process.
type provisioner struct {
	mu     sync.Mutex
	assets *Assets
}

// Provision makes sure every asset is there (fetching the kernel when fetch is true)
// and answers where they are. The initramfs is built once per guest binary and kernel,
// and kept in the cache under a key of both.
func (p *provisioner) Provision(ctx context.Context, cache string, fetch bool, log func(string, ...any)) (*Assets, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.assets != nil {
		return p.assets, nil
	}
	qemu, fsd, err := FindQEMU()
	if err != nil {
		return nil, err
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return nil, fmt.Errorf("%w: mkfs.ext4 is not installed (it makes the session disk): run `apt-get install e2fsprogs`", backend.ErrBootFailed)
	}
	k, err := ProvisionKernel(ctx, cache, fetch, log)
	if err != nil {
		return nil, err
	}
	bin, err := guestBinary(ctx, cache)
	if err != nil {
		return nil, err
	}
	initrd, err := buildInitramfs(cache, bin, k)
	if err != nil {
		return nil, fmt.Errorf("%w: initramfs: %v", backend.ErrBootFailed, err)
	}
	p.assets = &Assets{QEMU: qemu, Virtiofsd: fsd, MkfsExt4: mkfs, Kernel: k, Initramfs: initrd}
	return p.assets, nil
}

// guestBinary answers a static virtx binary for the guest's /init: this executable when
// it is static (no ELF interpreter), else one built from source with CGO_ENABLED=0
// (`go build virtx.dev/virtx/cmd/virtx`, which needs the go tool and the working
// directory inside the module: tests and development). The build is kept in the cache
// under the hash of this executable, so it happens once per binary.
func guestBinary(ctx context.Context, cache string) (string, error) {
	if p := os.Getenv("VIRTX_GUEST_BINARY"); p != "" {
		if err := checkStatic(p); err != nil {
			return "", fmt.Errorf("%w: VIRTX_GUEST_BINARY=%s: %v", backend.ErrBootFailed, p, err)
		}
		return p, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if checkStatic(self) == nil {
		return self, nil
	}
	sum, err := fileHash(self)
	if err != nil {
		return "", fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	dir := filepath.Join(cache, "vm", "guest")
	out := filepath.Join(dir, "virtx-"+sum[:16])
	if checkStatic(out) == nil {
		touch(out)
		return out, nil
	}
	defer prune(dir, "virtx-", keepBuilds)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "virtx.dev/virtx/cmd/virtx")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("%w: this virtx (%s) is dynamically linked and cannot be the guest's /init, and building a static one failed (%v: %s); build virtx with CGO_ENABLED=0, or set VIRTX_GUEST_BINARY to a static virtx", backend.ErrBootFailed, self, err, bytes.TrimSpace(b))
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	return out, nil
}

// checkStatic says whether p is an ELF without an interpreter (statically linked).
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", p)
		}
	}
	return nil
}

func fileHash(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// statKeyedHash is fileHash(p), remembered in dir under a key of p's identity and
// change times (device, inode, size, mtime, ctime): a cold session then does not hash
// a ~15 MB executable (~15 ms) to find the initramfs it already has. Replacing the file
// changes its ctime, which nothing can set back.
func statKeyedHash(dir, p string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return "", err
	}
	key := fmt.Sprintf("%x-%x-%x-%x.%x-%x.%x", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	memo := filepath.Join(dir, key)
	if b, err := os.ReadFile(memo); err == nil && len(b) == 64 {
		touch(memo)
		return string(b), nil
	}
	sum, err := fileHash(p)
	if err != nil {
		return "", err
	}
	if os.MkdirAll(dir, 0o755) == nil {
		_ = writeFileAtomic(memo, []byte(sum))
		prune(dir, "", 4*keepBuilds)
	}
	return sum, nil
}

// buildInitramfs writes (once) the initramfs of bin as /init and k's modules.
func buildInitramfs(cache, bin string, k *Kernel) (string, error) {
	h := sha256.New()
	bsum, err := statKeyedHash(filepath.Join(cache, "vm", "initramfs", "sums"), bin)
	if err != nil {
		return "", err
	}
	fmt.Fprintln(h, "initramfs v3", bsum, k.Version, k.StripSignatures)
	for i, m := range k.Modules {
		fmt.Fprintln(h, filepath.Base(m), k.ModuleDeps[i])
	}
	key := hex.EncodeToString(h.Sum(nil))[:20]
	dir := filepath.Join(cache, "vm", "initramfs")
	out := filepath.Join(dir, key+".cpio")
	if _, err := os.Stat(out); err == nil {
		touch(out)
		return out, nil
	}
	defer prune(dir, "", keepBuilds)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	w := newCPIOWriter(f)
	initBytes, err := os.ReadFile(bin)
	if err != nil {
		f.Close()
		return "", err
	}
	var lines []string
	err = func() error {
		for _, d := range []string{"dev", "proc", "sys", "mnt", "modules"} {
			if err := w.Dir(d, 0o755); err != nil {
				return err
			}
		}
		if err := w.File("init", 0o755, initBytes); err != nil {
			return err
		}
		for i, m := range k.Modules {
			b, err := os.ReadFile(m)
			if err != nil {
				return err
			}
			if k.StripSignatures {
				b = stripSignature(b)
			}
			line := filepath.Base(m)
			if i < len(k.ModuleDeps) && len(k.ModuleDeps[i]) > 0 {
				line += " " + strings.Join(k.ModuleDeps[i], " ")
			}
			lines = append(lines, line)
			if err := w.File("modules/"+filepath.Base(m), 0o644, b); err != nil {
				return err
			}
		}
		if err := w.File("modules/order.txt", 0o644, []byte(strings.Join(lines, "\n")+"\n")); err != nil {
			return err
		}
		return w.Close()
	}()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	return out, os.Rename(tmp, out)
}

// keepBuilds is how many guest binaries and initramfs images the cache keeps: one per
// virtx binary that booted a VM, so development and test runs, each with a binary of
// their own, do not grow the cache without end.
const keepBuilds = 4

// touch marks a cached build as just used.
func touch(p string) {
	now := time.Now()
	_ = os.Chtimes(p, now, now)
}

// prune removes all but the keep most recently used files of dir named prefix*,
// leaving temporary files (*.tmp*) of builds in progress alone.
func prune(dir, prefix string, keep int) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type f struct {
		name string
		mod  time.Time
	}
	var fs []f
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), prefix) || strings.Contains(e.Name(), ".tmp") {
			continue
		}
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			fs = append(fs, f{e.Name(), fi.ModTime()})
		}
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].mod.After(fs[j].mod) })
	for i := keep; i < len(fs); i++ {
		_ = os.Remove(filepath.Join(dir, fs[i].name))
	}
}
