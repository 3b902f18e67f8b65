package protocol

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMount(t *testing.T) {
	cases := []struct {
		in   string
		want Mount
		out  string // how it is written back; "" for the input itself
	}{
		// WIRE-NOTES.md: these must round-trip.
		{"file:///srv/odd:name:/work", Mount{URL: "file:///srv/odd:name", GuestPath: "/work"}, ""},
		{"https://example.com:8080/share:/work/in:ro", Mount{URL: "https://example.com:8080/share", GuestPath: "/work/in", ReadOnly: true}, ""},
		// PROTOCOL.md's own examples.
		{"file:///srv/project:/work:ro", Mount{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true}, ""},
		{"file:///srv/out:/work/out", Mount{URL: "file:///srv/out", GuestPath: "/work/out"}, ""},
		{"https://example.com:8080/share:/work", Mount{URL: "https://example.com:8080/share", GuestPath: "/work"}, ""},
		// rw is the default: sayable, and dropped when written back.
		{"file:///srv/out:/work/out:rw", Mount{URL: "file:///srv/out", GuestPath: "/work/out"}, "file:///srv/out:/work/out"},
		{"file:///srv/out:/work/out:rw:rw", Mount{URL: "file:///srv/out", GuestPath: "/work/out"}, "file:///srv/out:/work/out"},
		{"file:///srv/p:/work:ro:ro", Mount{URL: "file:///srv/p", GuestPath: "/work", ReadOnly: true}, "file:///srv/p:/work:ro"},
		// The URL may hold colons and segments that look like options or paths.
		{"file:///srv/x:ro:/work", Mount{URL: "file:///srv/x:ro", GuestPath: "/work"}, ""},
		{"file:///a:/b:/work", Mount{URL: "file:///a:/b", GuestPath: "/work"}, ""},
		{"http://[::1]:8080/x:/w:ro", Mount{URL: "http://[::1]:8080/x", GuestPath: "/w", ReadOnly: true}, ""},
		// Any scheme parses; refusing one this build cannot realise is the server's.
		{"s3+https://bucket/prefix:/data:ro", Mount{URL: "s3+https://bucket/prefix", GuestPath: "/data", ReadOnly: true}, ""},
		{"x-y.z://h:/w", Mount{URL: "x-y.z://h", GuestPath: "/w"}, ""},
		{"FILE:///srv:/w", Mount{URL: "FILE:///srv", GuestPath: "/w"}, ""},
		// The guest path is spelled as the client wrote it.
		{"file:///srv:/", Mount{URL: "file:///srv", GuestPath: "/"}, ""},
		{"file:///srv:/work/", Mount{URL: "file:///srv", GuestPath: "/work/"}, ""},
		{"file:///srv://work", Mount{URL: "file:///srv", GuestPath: "//work"}, ""},
		{"file:///:/w", Mount{URL: "file:///", GuestPath: "/w"}, ""},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := ParseMount(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			out := c.out
			if out == "" {
				out = c.in
			}
			if got.String() != out {
				t.Errorf("written back as %q, want %q", got.String(), out)
			}
			again, err := ParseMount(got.String())
			if err != nil || again != got {
				t.Errorf("%q reads back as %+v, %v", got.String(), again, err)
			}
		})
	}
	if s := (Mount{URL: "https://example.com:8080/share"}).Scheme(); s != "https" {
		t.Errorf("Scheme = %q", s)
	}
}

func TestParseMountRefused(t *testing.T) {
	for _, in := range []string{
		"",
		":",
		"/work",                    // a guest path and nothing else
		"ro",                       // an option and nothing else
		"/srv/project:/work",       // no scheme
		"srv/project:/work",        // no scheme, relative
		"file:/srv/project:/work",  // no "://"
		"file://:/work",            // nothing after "://"
		"file:/work",               // the scheme's colon mistaken for the separator
		"://srv:/work",             // empty scheme
		"1file:///srv:/work",       // scheme must start with a letter
		"fi le:///srv:/work",       // scheme with a space
		"file:///srv/project:work", // relative guest path
		"file:///srv/project:./work",
		"file:///srv/project:",            // empty guest path
		"file:///srv/project:/work:ro:rw", // both options
		"file:///srv/project:/work:rw:ro",
		"file:///srv/project:/work:noexec", // unknown option
		"file:///srv/project:/work:RO",     // options are lowercase
		"file:///srv/project:/work:",       // empty option
		"file:///srv/project:/work::ro",
		":/work",    // nothing before the guest path
		":/work:ro", // nothing before the guest path
		"file:///srv/project",
	} {
		if m, err := ParseMount(in); err == nil {
			t.Errorf("ParseMount(%q) = %+v, want an error", in, m)
		}
	}
}

func TestParsePort(t *testing.T) {
	cases := []struct {
		in   string
		want Port
		out  string
	}{
		{"8080:80", Port{8080, 80}, ""},
		{"5901:5900", Port{5901, 5900}, ""},
		{"1:1", Port{1, 1}, ""},
		{"65535:65535", Port{65535, 65535}, ""},
		{"08080:080", Port{8080, 80}, "8080:80"},
	}
	for _, c := range cases {
		got, err := ParsePort(c.in)
		if err != nil {
			t.Errorf("ParsePort(%q): %v", c.in, err)
			continue
		}
		if got != c.want {
			t.Errorf("ParsePort(%q) = %+v, want %+v", c.in, got, c.want)
		}
		out := c.out
		if out == "" {
			out = c.in
		}
		if got.String() != out {
			t.Errorf("%q written back as %q, want %q", c.in, got.String(), out)
		}
	}
}

func TestParsePortRefused(t *testing.T) {
	// WIRE-NOTES.md's list, verbatim.
	wireNotes := []string{"", "80", "80:", ":80", "0:80", "8080:0", "http", "70000:1", "1:2:3"}
	// And more of the same kind.
	ours := []string{
		":", "0:0", "65536:80", "80:65536", "-1:80", "+80:80", "80:+80", " 80:80", "80:80 ",
		"127.0.0.1:8080:80", "8080:80/tcp", "8080:80/udp", "0x50:80", "8080-8081:80",
		"99999999999999999999:80", "8080:99999999999999999999", "８０:80",
	}
	for _, in := range append(wireNotes, ours...) {
		if p, err := ParsePort(in); err == nil {
			t.Errorf("ParsePort(%q) = %+v, want an error", in, p)
		}
	}
}

// Every port that parses is written back as the same port.
func TestPortRoundTripAll(t *testing.T) {
	for h := 1; h <= 65535; h += 257 {
		for _, g := range []int{1, 80, 65535} {
			in := fmt.Sprintf("%d:%d", h, g)
			p, err := ParsePort(in)
			if err != nil || p.String() != in {
				t.Fatalf("%q: %+v, %v", in, p, err)
			}
		}
	}
}
