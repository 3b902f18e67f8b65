package image

import "testing"

func TestReferences(t *testing.T) {
	d := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ in, canon, familiar string }{
		{"alpine", "docker.io/library/alpine:latest", "alpine:latest"},
		{"alpine:3.20", "docker.io/library/alpine:3.20", "alpine:3.20"},
		{"library/alpine:3.20", "docker.io/library/alpine:3.20", "alpine:3.20"},
		{"docker.io/library/alpine:3.20", "docker.io/library/alpine:3.20", "alpine:3.20"},
		{"index.docker.io/library/alpine:3.20", "docker.io/library/alpine:3.20", "alpine:3.20"},
		{"myorg/tool:1", "docker.io/myorg/tool:1", "myorg/tool:1"},
		{"ghcr.io/org/x:v2", "ghcr.io/org/x:v2", "ghcr.io/org/x:v2"},
		{"127.0.0.1:5000/a/b", "127.0.0.1:5000/a/b:latest", "127.0.0.1:5000/a/b:latest"},
		{"alpine@" + d, "docker.io/library/alpine@" + d, "alpine@" + d},
		{"alpine:3.20@" + d, "docker.io/library/alpine@" + d, "alpine@" + d},
		{"ghcr.io/org/x@" + d, "ghcr.io/org/x@" + d, "ghcr.io/org/x@" + d},
	} {
		got, err := Normalize(tc.in)
		if err != nil || got != tc.canon {
			t.Errorf("Normalize(%q) = %q, %v; want %q", tc.in, got, err, tc.canon)
		}
		if f := Familiar(tc.in); f != tc.familiar {
			t.Errorf("Familiar(%q) = %q, want %q", tc.in, f, tc.familiar)
		}
	}
	r, err := ParseReference("alpine:3.20@" + d)
	if err != nil || r.Tag != "3.20" || r.Digest != d {
		t.Errorf("tag and digest: %+v %v", r, err)
	}
	for _, bad := range []string{"", "UPPER/case", "a b", "alpine@sha256:short", "alpine:"} {
		if _, err := Normalize(bad); err == nil {
			t.Errorf("Normalize(%q) accepted", bad)
		}
	}
}
