package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"virtx.dev/virtx/internal/backend"
)

// guestKernelConfig is the configuration of the kernel built for the guest: a Kconfig
// fragment applied over allnoconfig (see the file for why each part is there).
//
//go:embed guest-kernel.config
var guestKernelConfig string

// builtKernelLayout is the version of how BuildKernel builds; a change rebuilds.
const builtKernelLayout = "1"

// sourcePackage is the Debian metapackage of the newest kernel source.
const sourcePackage = "linux-source"

// buildPackages are what BuildKernel needs besides the source: the compiler and
// make (build-essential), the parser generators of Kconfig, libelf for objtool, bc
// for the timeconst header.
var buildPackages = []string{"build-essential", "flex", "bison", "libelf-dev", "bc", "xz-utils"}

// builtKernelDir is where built kernels live in the cache: apart from the fetched ones,
// whose layout version (kernelLayout) changes with the modules a guest needs, so that
// such a change never costs a rebuild.
func builtKernelDir(cache string) string { return filepath.Join(cache, "vm", "kernel-built") }

// BuildKernel builds the guest kernel from Debian's kernel source (linux-source-X.Y,
// installed with apt-get when missing and the caller is root) with guest-kernel.config
// and keeps its vmlinux in the cache, where ProvisionKernel then prefers it to the
// fetched cloud kernel. A kernel of this source version and configuration already
// built is taken as it is. It takes minutes (one `make vmlinux` of a small config);
// log tells where it is.
func BuildKernel(ctx context.Context, cache string, log func(string, ...any)) (*Kernel, error) {
	tarball, version, err := kernelSource(ctx, log)
	if err != nil {
		return nil, err
	}
	name := builtKernelName(version)
	final := filepath.Join(builtKernelDir(cache), name)
	if k, err := readKernelDir(final); err == nil {
		return k, setCurrent(builtKernelDir(cache), name)
	}
	if err := os.MkdirAll(builtKernelDir(cache), 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	tmp, err := os.MkdirTemp(builtKernelDir(cache), ".build-")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	start := time.Now()
	log("unpacking the kernel source", "tarball", tarball)
	if err := runLogged(ctx, filepath.Join(tmp, "unpack.log"), "", nil, "tar", "-xf", tarball, "-C", src, "--strip-components=1"); err != nil {
		return nil, err
	}
	frag := filepath.Join(tmp, "virtx.config")
	if err := os.WriteFile(frag, []byte(guestKernelConfig), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	env := []string{"KBUILD_BUILD_USER=virtx", "KBUILD_BUILD_HOST=virtx", "KBUILD_BUILD_TIMESTAMP=" + version}
	if err := runLogged(ctx, filepath.Join(tmp, "config.log"), src, env, "make", "allnoconfig", "KCONFIG_ALLCONFIG="+frag); err != nil {
		return nil, err
	}
	got, err := os.ReadFile(filepath.Join(src, ".config"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if missing := missingConfig(guestKernelConfig, string(got)); len(missing) > 0 {
		return nil, fmt.Errorf("%w: the kernel source %s does not take guest-kernel.config: %s did not end up as asked (a renamed or dropped option, or an unmet dependency)", backend.ErrBootFailed, version, strings.Join(missing, ", "))
	}
	jobs := strconv.Itoa(runtime.NumCPU() + 1)
	log("building the guest kernel (a few minutes)", "version", version, "jobs", jobs)
	if err := runLogged(ctx, filepath.Join(tmp, "build.log"), src, env, "make", "-j"+jobs, "vmlinux"); err != nil {
		return nil, err
	}
	vmlinux, err := os.ReadFile(filepath.Join(src, "vmlinux"))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := checkPVH(vmlinux); err != nil {
		return nil, fmt.Errorf("%w: the built kernel: %v", backend.ErrBootFailed, err)
	}
	out := filepath.Join(tmp, "out")
	if err := os.MkdirAll(filepath.Join(out, "modules"), 0o755); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	// Everything the guest needs is built in: an empty module list.
	if err := os.WriteFile(filepath.Join(out, "modules", "order.txt"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.WriteFile(filepath.Join(out, "vmlinux"), vmlinux, 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := os.WriteFile(filepath.Join(out, "config"), got, 0o644); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	os.RemoveAll(final)
	if err := os.Rename(out, final); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	if err := setCurrent(builtKernelDir(cache), name); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	// Kernels built before from another source or configuration are nobody's now.
	if ents, err := os.ReadDir(builtKernelDir(cache)); err == nil {
		for _, e := range ents {
			if e.IsDir() && e.Name() != name && !strings.HasPrefix(e.Name(), ".") {
				os.RemoveAll(filepath.Join(builtKernelDir(cache), e.Name()))
			}
		}
	}
	log("built the guest kernel", "version", name, "took", time.Since(start).Round(time.Second))
	return readKernelDir(final)
}

// builtKernelName is the cache's name of the kernel built from a source version: the
// version, then a hash of the configuration and of how it is built.
func builtKernelName(version string) string {
	return fmt.Sprintf("%s-virtx-%s", version, configHash())
}

// configHash is a short hash of the configuration and of how it is built.
func configHash() string {
	sum := sha256.Sum256([]byte(builtKernelLayout + "\n" + guestKernelConfig))
	return hex.EncodeToString(sum[:6])
}

// kernelSource finds the newest kernel source tarball Debian's linux-source-X.Y put
// in /usr/src, installing it and the build tools first when any is missing, and
// answers it with its package version.
func kernelSource(ctx context.Context, log func(string, ...any)) (tarball, version string, err error) {
	tarball, pkg := newestSource()
	var missing []string
	for _, tool := range []string{"make", "gcc", "flex", "bison", "bc", "xz", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if _, err := os.Stat("/usr/include/libelf.h"); err != nil {
		missing = append(missing, "libelf.h")
	}
	if tarball == "" || len(missing) > 0 {
		pkgs := append([]string{sourcePackage}, buildPackages...)
		if tarball == "" {
			missing = append(missing, "the kernel source in /usr/src")
		}
		if os.Geteuid() != 0 {
			return "", "", fmt.Errorf("%w: building the guest kernel needs the kernel source and build tools (missing: %s): run `sudo apt-get install %s` first", backend.ErrBootFailed, strings.Join(missing, ", "), strings.Join(pkgs, " "))
		}
		log("installing the kernel source and build tools", "packages", strings.Join(pkgs, " "))
		if err := aptInstall(ctx, pkgs); err != nil {
			return "", "", err
		}
		if tarball, pkg = newestSource(); tarball == "" {
			return "", "", fmt.Errorf("%w: apt-get installed %s but /usr/src has no linux-source-*.tar.xz", backend.ErrBootFailed, sourcePackage)
		}
	}
	out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Version}", pkg).Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		// Not from a package (or no dpkg): the tarball's own size and time stand in.
		fi, serr := os.Stat(tarball)
		if serr != nil {
			return "", "", fmt.Errorf("%w: %v", backend.ErrBootFailed, serr)
		}
		return tarball, fmt.Sprintf("%s-%d-%d", strings.TrimPrefix(pkg, "linux-source-"), fi.Size(), fi.ModTime().Unix()), nil
	}
	return tarball, string(bytes.TrimSpace(out)), nil
}

// newestSource answers the /usr/src/linux-source-X.Y.tar.xz of the highest X.Y, and
// the package that ships it ("linux-source-X.Y").
func newestSource() (tarball, pkg string) {
	paths, _ := filepath.Glob("/usr/src/linux-source-*.tar.xz")
	sort.Slice(paths, func(i, j int) bool {
		return versionLess(sourceVersion(paths[i]), sourceVersion(paths[j]))
	})
	if len(paths) == 0 {
		return "", ""
	}
	p := paths[len(paths)-1]
	return p, "linux-source-" + sourceVersion(p)
}

func sourceVersion(p string) string {
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "linux-source-"), ".tar.xz")
}

// versionLess compares dotted numeric versions ("6.1" < "6.12").
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) && i < len(bs); i++ {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return len(as) < len(bs)
}

// aptInstall installs pkgs, refreshing the package lists once when they are stale.
func aptInstall(ctx context.Context, pkgs []string) error {
	install := func() ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd.CombinedOutput()
	}
	if _, err := install(); err == nil {
		return nil
	}
	if out, err := exec.CommandContext(ctx, "apt-get", "update").CombinedOutput(); err != nil {
		return fmt.Errorf("%w: apt-get update: %v: %s", backend.ErrBootFailed, err, tail(out, 10))
	}
	if out, err := install(); err != nil {
		return fmt.Errorf("%w: apt-get install %s: %v: %s", backend.ErrBootFailed, strings.Join(pkgs, " "), err, tail(out, 10))
	}
	return nil
}

// runLogged runs a build step with its output in logFile, and on failure answers an
// error with the log's last lines.
func runLogged(ctx context.Context, logFile, dir string, env []string, name string, args ...string) error {
	f, err := os.Create(logFile)
	if err != nil {
		return fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logFile)
		return fmt.Errorf("%w: %s %s: %v: %s", backend.ErrBootFailed, name, strings.Join(args, " "), err, tail(out, 20))
	}
	return nil
}

// tail answers the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// missingConfig answers the options a fragment sets (to y or a value) that a resulting
// .config does not have so: a dependency the fragment missed, or an option renamed.
func missingConfig(fragment, config string) []string {
	have := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(config))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok && strings.HasPrefix(k, "CONFIG_") {
			have[k] = v
		}
	}
	var missing []string
	sc = bufio.NewScanner(strings.NewReader(fragment))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "CONFIG_") {
			continue
		}
		if have[k] != v {
			missing = append(missing, line)
		}
	}
	return missing
}

// builtKernel reads the built kernel in use (the one to prefer over the fetched one).
func builtKernel(cache string) (*Kernel, error) { return currentKernel(builtKernelDir(cache)) }

// KernelStatus says which guest kernel a boot would take from cache ($VIRTX_KERNEL, the
// built one, the fetched one), for `virtx doctor`: ok false when there is none yet, with
// the command that provisions one.
func KernelStatus(cache string) (detail string, ok bool, fix string) {
	const build = "virtx setup vm --build-kernel"
	if k := os.Getenv("VIRTX_KERNEL"); k != "" {
		return "VIRTX_KERNEL=" + k, true, ""
	}
	if k, err := builtKernel(cache); err == nil {
		return "built for the guest: " + k.Version, true, ""
	}
	if k, err := cachedKernel(cache); err == nil {
		return "Debian's cloud kernel " + k.Version + " (`" + build + "` builds the guest's own, which boots in about half the time under TCG)", true, ""
	}
	if _, err := exec.LookPath("apt-get"); err == nil {
		return "none yet: the first vm boot fetches Debian's cloud kernel; `" + build + "` builds the guest's own, which boots in about half the time", true, ""
	}
	return "none in " + filepath.Join(cache, "vm") + ", and no apt-get to fetch one", false, "set VIRTX_KERNEL to a kernel image with CONFIG_PVH=y and virtio-mmio, virtiofs, overlay, ext4 built in"
}
