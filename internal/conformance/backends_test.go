package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"virtx.dev/virtx/protocol"
)

// target is one backend as the suite sees it: how a test tree is placed, and the cases it
// declares it cannot run (with why) or answers with another code.
type target struct {
	name string
	// guestPathFor says where a host directory is seen in a session. The host backend
	// mounts nothing, so a tree is seen at its own path.
	guestPathFor func(hostDir, name string) string
	// unsupported: case name → the reason this backend cannot run it.
	unsupported map[string]string
	// codes: what this backend answers for things the protocol leaves to the backend.
	codes map[string]protocol.Code
}

var targets = map[string]target{
	"host": {
		name:         "host",
		guestPathFor: func(hostDir, _ string) string { return hostDir },
		unsupported: map[string]string{
			"init/network-off":       "the host backend cannot take the network away (it answers -32010)",
			"init/machine-shape":     "the host backend enforces no limits (it answers -32013)",
			"trees/elsewhere":        "the host backend mounts nothing, so a tree is only seen at its own path",
			"trees/ro-command-erofs": "the host backend enforces ro for the write method only",
		},
		codes: map[string]protocol.Code{
			"snapshot":       protocol.CodeMethodNotFound,
			"network-off":    protocol.CodeUnsupportedNetwork,
			"image":          protocol.CodeUnsupportedImage,
			"init-snapshot":  protocol.CodeUnsupportedImage,
			"machine-shape":  protocol.CodeUnsupportedMachine,
			"tree-elsewhere": protocol.CodeUnsupportedMount,
			"build-image":    protocol.CodeUnsupportedImage,
		},
	},
	"sandbox": {
		name: "sandbox",
		// Trees are bind mounts at any guest path: the suite puts them elsewhere than
		// where they are on the host, so nothing passes by seeing the host's own path.
		guestPathFor: func(_, name string) string { return "/work/" + name },
		// vcpus and memory_mib are cgroup limits; where this host cannot enforce them
		// (rootless here) sandboxLimitsTarget declares machine-shape refused.
		unsupported: map[string]string{},
		codes: map[string]protocol.Code{
			// A ref nobody has: -32012 as root (the pull fails); rootless, images are
			// refused (-32011: the store's layers need root). build-image is 0: the
			// sandbox builds (sandbox_image_test.go), and its unbuildable base would be
			// asked of Docker Hub.
			"image": sandboxImageCode(),
		},
	},
	"vm": {
		name: "vm",
		// Trees are virtiofs binds at any guest path, away from their host paths.
		guestPathFor: func(_, name string) string { return "/work/" + name },
		codes: map[string]protocol.Code{
			// A digest the store lacks: -32012 as root; without root the vm backend
			// refuses images (-32011: the store's layers need root).
			"image": vmImageCode(),
		},
	},
}

// defaultBackends are the backends the suite runs when VIRTX_CONFORMANCE_BACKENDS says
// nothing: all of them. A backend whose prerequisites are missing skips locally, naming
// the package, and fails under CI=true — a green run that skipped a backend is a lie.
const defaultBackends = "host,sandbox,vm"

// selectedNames are the backends VIRTX_CONFORMANCE_BACKENDS names (comma-separated).
func selectedNames() []string {
	names := os.Getenv("VIRTX_CONFORMANCE_BACKENDS")
	if names == "" {
		names = defaultBackends
	}
	var out []string
	for _, n := range strings.Split(names, ",") {
		out = append(out, strings.TrimSpace(n))
	}
	return out
}

// backendSelected says whether the suite runs against the named backend.
func backendSelected(name string) bool {
	for _, n := range selectedNames() {
		if n == name {
			return true
		}
	}
	return false
}

// selectedTargets are the selected backends' targets.
func selectedTargets(t *testing.T) []target {
	var out []target
	for _, n := range selectedNames() {
		tg, ok := targets[n]
		if !ok {
			t.Fatalf("VIRTX_CONFORMANCE_BACKENDS names %q, which the suite does not know", n)
		}
		out = append(out, tg)
	}
	return out
}

// requireTarget checks a backend's prerequisites before its cases run.
func requireTarget(t *testing.T, name string) {
	switch name {
	case "sandbox":
		requireSandbox(t)
	case "vm":
		requireVM(t)
	}
}

// env is what a case is given: the backend, and a way to make trees.
type env struct {
	t      *testing.T
	target target
}

// tree makes a host directory holding files, and the mount string and guest path under
// which a session sees it.
func (e *env) tree(name string, ro bool, files map[string]string) (hostDir, guest string, m protocol.Mount) {
	e.t.Helper()
	hostDir = filepath.Join(e.t.TempDir(), name)
	if err := os.MkdirAll(hostDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(hostDir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			e.t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			e.t.Fatal(err)
		}
	}
	guest = e.target.guestPathFor(hostDir, name)
	return hostDir, guest, protocol.Mount{URL: "file://" + hostDir, GuestPath: guest, ReadOnly: ro}
}

// code is what this backend answers for a backend-specific refusal, else def.
func (e *env) code(key string, def protocol.Code) protocol.Code {
	if c, ok := e.target.codes[key]; ok {
		return c
	}
	return def
}

func (e *env) peer() *peer { return startPeer(e.t, e.target.name) }

func TestConformance(t *testing.T) {
	for _, tg := range selectedTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			requireTarget(t, tg.name)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					if why, ok := tg.unsupported[c.name]; ok {
						t.Skipf("declared unsupported on %s: %s", tg.name, why)
					}
					c.run(&env{t: t, target: tg})
				})
			}
		})
	}
}
