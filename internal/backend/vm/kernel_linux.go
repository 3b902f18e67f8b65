package vm

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pierrec/lz4/v4"

	"virtx.dev/virtx/internal/backend"
)

// kernelPackage is the Debian metapackage whose versioned dependency is the kernel.
const kernelPackage = "linux-image-cloud-amd64"

// guestModules are the modules the guest needs, by name; their dependencies are added
// from each module's own modinfo "depends=" (the package ships no modules.dep: depmod
// makes it at install time, and we never install the package).
var guestModules = []string{
	"virtio_mmio", "virtio_console", "virtio_blk", "virtio_net",
	"fuse", "virtiofs", "overlay", "erofs",
}

// Kernel is a provisioned guest kernel: the PVH-bootable ELF vmlinux and the modules the
// guest loads, in load order (dependencies first).
type Kernel struct {
	Version string
	Vmlinux string   // path to the ELF vmlinux
	Modules []string // paths to .ko files, dependencies first
	// ModuleDeps are, for each of Modules, the file names of the modules it needs.
	ModuleDeps [][]string
	// StripSignatures: the initramfs gets the modules without their signatures. True
	// for the Debian kernel the cache provisions, which does not enforce them (no
	// MODULE_SIG_FORCE, and a PVH boot has no Secure Boot lockdown): checking one is a
	// SHA-512 of the whole module and an RSA verification, CPU a TCG guest pays at every
	// boot for a module we copied from the package ourselves.
	StripSignatures bool
}

// kernelLayout is the version of the cache's kernel layout; a change re-extracts.
const kernelLayout = "3"

// kernelDir is where provisioned kernels live in the cache.
func kernelDir(cache string) string { return filepath.Join(cache, "vm", "kernel"+kernelLayout) }

// ProvisionKernel finds the guest kernel: $VIRTX_KERNEL when set, else the kernel
// built for the guest (BuildKernel) when the cache has one, else the fetched one in the
// cache, else (when fetch is true) it downloads the Debian cloud kernel package with
// apt-get and extracts it into the cache. The answer is cached: a second call is a stat.
func ProvisionKernel(ctx context.Context, cache string, fetch bool, log func(string, ...any)) (*Kernel, error) {
	if k := os.Getenv("VIRTX_KERNEL"); k != "" {
		return kernelFromEnv(cache, k)
	}
	if k, err := builtKernel(cache); err == nil {
		return k, nil
	}
	if k, err := cachedKernel(cache); err == nil {
		return k, nil
	}
	if !fetch {
		return nil, fmt.Errorf("%w: no guest kernel in %s: run `virtx setup vm` (it fetches the Debian package %s)", backend.ErrBootFailed, kernelDir(cache), kernelPackage)
	}
	return fetchKernel(ctx, cache, log)
}

// currentFile names, in a directory of kernels, the one in use.
const currentFile = "current"

// currentKernel reads the kernel that dir's currentFile names.
func currentKernel(dir string) (*Kernel, error) {
	cur, err := os.ReadFile(filepath.Join(dir, currentFile))
	if err != nil {
		return nil, err
	}
	return readKernelDir(filepath.Join(dir, strings.TrimSpace(string(cur))))
}

// setCurrent makes name the kernel in use in dir.
func setCurrent(dir, name string) error {
	return writeFileAtomic(filepath.Join(dir, currentFile), []byte(name+"\n"))
}

// cachedKernel reads the fetched kernel in use.
func cachedKernel(cache string) (*Kernel, error) {
	k, err := currentKernel(kernelDir(cache))
	if k != nil {
		k.StripSignatures = true
	}
	return k, err
}

// readKernelDir reads an extracted kernel: vmlinux and modules/ with order.txt.
func readKernelDir(dir string) (*Kernel, error) {
	k := &Kernel{Version: filepath.Base(dir), Vmlinux: filepath.Join(dir, "vmlinux")}
	if _, err := os.Stat(k.Vmlinux); err != nil {
		return nil, err
	}
	order, err := os.ReadFile(filepath.Join(dir, "modules", "order.txt"))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(order), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			k.Modules = append(k.Modules, filepath.Join(dir, "modules", f[0]))
			k.ModuleDeps = append(k.ModuleDeps, f[1:])
		}
	}
	return k, nil
}

// kernelFromEnv takes $VIRTX_KERNEL: a directory laid out as the cache's (vmlinux and
// modules/order.txt), or a kernel image (bzImage or ELF vmlinux) whose drivers are built
// in, or whose modules $VIRTX_KERNEL_MODULES names (a lib/modules/VERSION directory).
func kernelFromEnv(cache, p string) (*Kernel, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("%w: VIRTX_KERNEL=%s: %v", backend.ErrBootFailed, p, err)
	}
	if fi.IsDir() {
		k, err := readKernelDir(p)
		if err != nil {
			return nil, fmt.Errorf("%w: VIRTX_KERNEL=%s: want a directory with vmlinux and modules/order.txt: %v", backend.ErrBootFailed, p, err)
		}
		return k, nil
	}
	img, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%w: VIRTX_KERNEL: %v", backend.ErrBootFailed, err)
	}
	vmlinux, err := PVHVmlinux(img)
	if err != nil {
		return nil, fmt.Errorf("%w: VIRTX_KERNEL=%s: %v", backend.ErrBootFailed, p, err)
	}
	key := fmt.Sprintf("env-%x-%d", fi.ModTime().UnixNano(), fi.Size())
	dir := filepath.Join(kernelDir(cache), key)
	if k, err := readKernelDir(dir); err == nil {
		return k, nil
	}
	tmp, err := os.MkdirTemp(kernelDir(cache), ".tmp-")
	if err != nil {
		if err := os.MkdirAll(kernelDir(cache), 0o755); err != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
		}
		if tmp, err = os.MkdirTemp(kernelDir(cache), ".tmp-"); err != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
		}
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, "vmlinux"), vmlinux, 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	var order []string
	if md := os.Getenv("VIRTX_KERNEL_MODULES"); md != "" {
		if order, err = copyModules(md, filepath.Join(tmp, "modules")); err != nil {
			return nil, fmt.Errorf("%w: VIRTX_KERNEL_MODULES=%s: %v", backend.ErrBootFailed, md, err)
		}
	} else if err := os.MkdirAll(filepath.Join(tmp, "modules"), 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "modules", "order.txt"), []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, os.ErrExist) {
		if _, err2 := os.Stat(dir); err2 != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
		}
	}
	return readKernelDir(dir)
}

// fetchKernel downloads the cloud kernel package with apt-get, extracts it with
// dpkg-deb into a temp dir and keeps the vmlinux and the needed modules in the cache.
func fetchKernel(ctx context.Context, cache string, log func(string, ...any)) (*Kernel, error) {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%w: %s is not on PATH, so the guest kernel (Debian's %s) cannot be fetched; set VIRTX_KERNEL to a kernel image", backend.ErrBootFailed, tool, kernelPackage)
		}
	}
	if err := os.MkdirAll(kernelDir(cache), 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	pkg, err := kernelImagePackage(ctx)
	if err != nil {
		return nil, err
	}
	log("fetching the guest kernel", "package", pkg)
	tmp, err := os.MkdirTemp(kernelDir(cache), ".fetch-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	defer os.RemoveAll(tmp)
	dl := exec.CommandContext(ctx, "apt-get", "download", pkg)
	dl.Dir = tmp
	if out, err := dl.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: apt-get download %s: %v: %s (run `apt-get update` first, or set VIRTX_KERNEL)", backend.ErrBootFailed, pkg, err, bytes.TrimSpace(out))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("%w: apt-get download %s left %d packages", backend.ErrBootFailed, pkg, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: dpkg-deb -x %s: %v: %s", backend.ErrBootFailed, debs[0], err, bytes.TrimSpace(out))
	}
	vmlinuzs, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuzs) != 1 {
		return nil, fmt.Errorf("%w: package %s has %d kernels in /boot", backend.ErrBootFailed, pkg, len(vmlinuzs))
	}
	version := strings.TrimPrefix(filepath.Base(vmlinuzs[0]), "vmlinuz-")
	img, err := os.ReadFile(vmlinuzs[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	vmlinux, err := PVHVmlinux(img)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", backend.ErrBootFailed, vmlinuzs[0], err)
	}
	out := filepath.Join(tmp, version)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.WriteFile(filepath.Join(out, "vmlinux"), vmlinux, 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	order, err := copyModules(filepath.Join(root, "lib", "modules", version), filepath.Join(out, "modules"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.WriteFile(filepath.Join(out, "modules", "order.txt"), []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	final := filepath.Join(kernelDir(cache), version)
	os.RemoveAll(final)
	if err := os.Rename(out, final); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := setCurrent(kernelDir(cache), version); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	pruneKernelLayouts(cache)
	k, err := readKernelDir(final)
	if k != nil {
		k.StripSignatures = true
	}
	return k, err
}

// pruneKernelLayouts removes the fetched kernels of earlier cache layouts
// (vm/kernel, vm/kernel2, …): a layout change fetches anew, and the old ones are
// nobody's.
func pruneKernelLayouts(cache string) {
	dirs, _ := filepath.Glob(filepath.Join(cache, "vm", "kernel*"))
	for _, d := range dirs {
		name := filepath.Base(d)
		if rest := strings.TrimPrefix(name, "kernel"); rest != kernelLayout && strings.Trim(rest, "0123456789") == "" {
			os.RemoveAll(d)
		}
	}
}

// moduleSigMagic ends a signed module: the signature, then struct module_signature
// (12 bytes, the signature's length big-endian in the last 4), then this.
const moduleSigMagic = "~Module signature appended~\n"

// stripSignature answers a module without its appended signature (b itself when it
// has none).
func stripSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) || len(b) < len(moduleSigMagic)+12 {
		return b
	}
	end := len(b) - len(moduleSigMagic)
	n := int(binary.BigEndian.Uint32(b[end-4 : end]))
	if n <= 0 || end-12-n < 0 {
		return b
	}
	return b[:end-12-n]
}

// kernelImagePackage resolves the metapackage to the versioned kernel package it depends on.
func kernelImagePackage(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", kernelPackage).Output()
	if err != nil {
		return "", fmt.Errorf("%w: apt-cache depends %s: %v (run `apt-get update`)", backend.ErrBootFailed, kernelPackage, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return strings.TrimSpace(dep), nil
		}
	}
	return "", fmt.Errorf("%w: apt-cache knows no %s (run `apt-get update`; on a non-Debian host set VIRTX_KERNEL)", backend.ErrBootFailed, kernelPackage)
}

// copyModules copies guestModules and their dependencies from a lib/modules/VERSION
// directory into dst, and returns their file names in load order, each followed by the
// file names of the modules it depends on (the lines of order.txt).
func copyModules(modDir, dst string) ([]string, error) {
	paths := map[string]string{} // module name → path
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			paths[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[strings.ReplaceAll(strings.TrimSuffix(filepath.Base(l), ".ko"), "-", "_")] = true
		}
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string) error
	visit = func(name string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		case 2:
			return nil
		}
		p, ok := paths[name]
		if !ok {
			if builtin[name] {
				state[name] = 2
				return nil
			}
			return fmt.Errorf("module %s is neither in %s nor built in", name, modDir)
		}
		state[name] = 1
		deps, err := moduleDepends(p)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, name+".ko"), b, 0o644); err != nil {
			return err
		}
		line := name + ".ko"
		for _, d := range deps {
			if !builtin[d] {
				line += " " + d + ".ko"
			}
		}
		order = append(order, line)
		return nil
	}
	for _, m := range guestModules {
		if err := visit(m); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleDepends reads the depends= entry of a module's .modinfo section.
func moduleDepends(p string) ([]string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, strings.ReplaceAll(d, "-", "_"))
			}
		}
	}
	sort.Strings(deps)
	return deps, nil
}

// PVHVmlinux returns the ELF vmlinux of a kernel image: img itself when it is an ELF,
// else the payload of an x86 bzImage, decompressed. QEMU boots the ELF by PVH (its
// XEN_ELFNOTE_PHYS32_ENTRY note), which is what makes a microvm boot without firmware.
// The Debian cloud kernel's payload is LZ4 (the kernel's "legacy" LZ4 framing); gzip,
// xz and zstd payloads are not handled and say so.
func PVHVmlinux(img []byte) ([]byte, error) {
	if bytes.HasPrefix(img, []byte(elf.ELFMAG)) {
		return img, checkPVH(img)
	}
	if len(img) < 0x250 || string(img[0x202:0x206]) != "HdrS" {
		return nil, errors.New("neither an ELF vmlinux nor an x86 bzImage (no HdrS header)")
	}
	setupSects := int(img[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	pm := (setupSects + 1) * 512
	off := int(binary.LittleEndian.Uint32(img[0x248:]))
	n := int(binary.LittleEndian.Uint32(img[0x24c:]))
	if pm+off+n > len(img) || n < 8 {
		return nil, errors.New("bzImage payload out of bounds")
	}
	payload := img[pm+off : pm+off+n]
	var out []byte
	var err error
	switch {
	case bytes.HasPrefix(payload, []byte{0x02, 0x21, 0x4c, 0x18}):
		out, err = unlz4Legacy(payload)
	default:
		return nil, fmt.Errorf("bzImage payload compressed with something other than LZ4 (magic % x); set VIRTX_KERNEL to an ELF vmlinux", payload[:4])
	}
	if err != nil {
		return nil, err
	}
	return out, checkPVH(out)
}

// unlz4Legacy decompresses the LZ4 legacy framing the kernel build uses (lz4 -l): a magic,
// then blocks each prefixed by their compressed length, each decompressing to at most
// 8 MiB; the kernel's build appends the uncompressed size as 4 bytes.
func unlz4Legacy(p []byte) ([]byte, error) {
	total := int(binary.LittleEndian.Uint32(p[len(p)-4:]))
	if total <= 0 || total > 1<<30 {
		return nil, fmt.Errorf("lz4: implausible uncompressed size %d", total)
	}
	out := make([]byte, 0, total)
	block := make([]byte, 8<<20)
	for i := 4; i+4 <= len(p) && len(out) < total; {
		n := int(binary.LittleEndian.Uint32(p[i:]))
		i += 4
		if n == 0x184c2102 { // a further stream's magic
			continue
		}
		if n <= 0 || i+n > len(p) {
			break
		}
		m, err := lz4.UncompressBlock(p[i:i+n], block)
		if err != nil {
			return nil, fmt.Errorf("lz4 block at %d: %w", i, err)
		}
		out = append(out, block[:m]...)
		i += n
	}
	if len(out) != total {
		return nil, fmt.Errorf("lz4: %d bytes decompressed, the trailer says %d", len(out), total)
	}
	return out, nil
}

// checkPVH checks that an ELF kernel has the PVH entry note QEMU boots it by.
func checkPVH(b []byte) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("vmlinux: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			continue
		}
		for len(data) >= 12 {
			nsz := int(binary.LittleEndian.Uint32(data))
			dsz := int(binary.LittleEndian.Uint32(data[4:]))
			typ := binary.LittleEndian.Uint32(data[8:])
			al := func(x int) int { return (x + 3) &^ 3 }
			if 12+al(nsz)+al(dsz) > len(data) {
				break
			}
			name := string(bytes.TrimRight(data[12:12+nsz], "\x00"))
			if name == "Xen" && typ == 18 { // XEN_ELFNOTE_PHYS32_ENTRY
				return nil
			}
			data = data[12+al(nsz)+al(dsz):]
		}
	}
	return errors.New("vmlinux has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): the kernel needs CONFIG_PVH=y")
}

// writeFileAtomic writes a file by rename, so readers see the old or the new whole.
func writeFileAtomic(p string, b []byte) error {
	tmp := fmt.Sprintf("%s.tmp%d", p, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
