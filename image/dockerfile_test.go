package image

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"virtx.dev/virtx/protocol"
)

func run(s string) protocol.Step { return protocol.Step{Kind: protocol.StepRun, Run: s} }
func env(k, v string) protocol.Step {
	return protocol.Step{Kind: protocol.StepEnv, Key: k, Value: v}
}
func wd(d string) protocol.Step { return protocol.Step{Kind: protocol.StepWorkdir, Workdir: d} }
func cp(src, dst string) protocol.Step {
	return protocol.Step{Kind: protocol.StepCopy, Src: src, Dst: dst}
}

func TestParseDockerfileAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       *protocol.Recipe
	}{
		{"FROM only", "FROM alpine:3.20\n", &protocol.Recipe{Base: "alpine:3.20"}},
		{"FROM AS", "from alpine AS build\n", &protocol.Recipe{Base: "alpine"}},
		{"FROM scratch", "FROM scratch\nCOPY a /a\n", &protocol.Recipe{Base: "scratch", Steps: []protocol.Step{cp("a", "/a")}}},
		{"FROM digest", "FROM alpine@sha256:" + strings.Repeat("a", 64), &protocol.Recipe{Base: "alpine@sha256:" + strings.Repeat("a", 64)}},
		{"RUN shell form", "FROM a\nRUN apk add --no-cache jq && echo $HOME\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run("apk add --no-cache jq && echo $HOME")}}},
		{"RUN exec form", "FROM a\nRUN [\"echo\", \"it's\", \"a b\", \"plain\"]\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run(`echo 'it'\''s' 'a b' plain`)}}},
		{"RUN starting with [", "FROM a\nRUN [ -f /x ] || touch /x\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run("[ -f /x ] || touch /x")}}},
		{"lowercase instructions", "from a\nrun true\nenv K v\nworkdir /w\ncopy x y\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run("true"), env("K", "v"), wd("/w"), cp("x", "/w/y")}}},
		{"continuations and comments", "# a comment\n\nFROM a\nRUN apt-get update && \\\n    # comment inside\n    apt-get install -y \\\n      jq\n  # indented comment\nRUN true \\\n\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run("apt-get update &&     apt-get install -y       jq"), run("true")}}},
		{"syntax directive", "# syntax=docker/dockerfile:1\nFROM a\n", &protocol.Recipe{Base: "a"}},
		{"escape directive backslash", "# escape=\\\nFROM a\n", &protocol.Recipe{Base: "a"}},
		{"CRLF", "FROM a\r\nRUN true\r\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{run("true")}}},
		{"ENV K V", "FROM a\nENV PATH /opt/bin:/usr/bin\nENV MSG hello   world\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("PATH", "/opt/bin:/usr/bin"), env("MSG", "hello   world")}}},
		{"ENV K=V several", "FROM a\nENV A=1 B=\"two words\" C='$lit' D=a\\ b E=\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("A", "1"), env("B", "two words"), env("C", "$lit"), env("D", "a b"), env("E", "")}}},
		{"ENV substitution", "FROM a\nENV BASE=/opt\nENV BIN=$BASE/bin LIB=${BASE}/lib X=${NOPE:-dflt} Y=${BASE:+set} Z=${NOPE:+set}\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("BASE", "/opt"), env("BIN", "/opt/bin"), env("LIB", "/opt/lib"), env("X", "dflt"), env("Y", "set"), env("Z", "")}}},
		{"ENV one line uses the env before it", "FROM a\nENV A=1\nENV A=2 B=$A\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("A", "1"), env("A", "2"), env("B", "1")}}},
		{"ENV escaped dollar", "FROM a\nENV P=\\$HOME Q=\"\\$X\"\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("P", "$HOME"), env("Q", "$X")}}},
		{"WORKDIR absolute and relative", "FROM a\nWORKDIR /src\nWORKDIR app/\nWORKDIR ../lib\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{wd("/src"), wd("/src/app"), wd("/src/lib")}}},
		{"WORKDIR substitution", "FROM a\nENV D=/data\nWORKDIR $D/x\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("D", "/data"), wd("/data/x")}}},
		{"COPY forms", "FROM a\nCOPY . /src\nCOPY a b /dst/\nCOPY [\"with space\", \"/x y\"]\nWORKDIR /w\nCOPY f rel/\nCOPY g ./\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{cp(".", "/src"), cp("a", "/dst/"), cp("b", "/dst/"), cp("with space", "/x y"), wd("/w"), cp("f", "/w/rel/"), cp("g", "/w/")}}},
		{"COPY substitution", "FROM a\nENV V=1.2\nCOPY dist/$V /opt/v$V\n", &protocol.Recipe{Base: "a", Steps: []protocol.Step{env("V", "1.2"), cp("dist/1.2", "/opt/v1.2")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDockerfile(strings.NewReader(tc.file), "Dockerfile")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

func TestParseDockerfileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		line       int
		msg        string
	}{
		{"empty", "", 1, "no FROM"},
		{"only comments", "# nothing\n\n", 1, "no FROM"},
		{"RUN before FROM", "\nRUN true\n", 2, "RUN before FROM"},
		{"second FROM", "FROM a\nRUN true\nFROM b\n", 3, "multi-stage"},
		{"FROM flag", "FROM --platform=linux/arm64 a\n", 1, "flags are not supported"},
		{"FROM variable", "FROM a:$V\n", 1, "variables are not supported"},
		{"FROM bad AS", "FROM a b\n", 1, "AS NAME"},
		{"FROM bad ref", "FROM UPPER\n", 1, "FROM"},
		{"FROM nothing", "FROM\n", 1, "FROM needs an image"},
		{"ADD", "FROM a\nADD x /x\n", 2, "use COPY"},
		{"ARG", "ARG V=1\nFROM a\n", 1, "ARG is not supported"},
		{"CMD", "FROM a\nCMD [\"sh\"]\n", 2, "CMD is not supported"},
		{"ENTRYPOINT", "FROM a\nENTRYPOINT x\n", 2, "ENTRYPOINT"},
		{"LABEL", "FROM a\nLABEL a=b\n", 2, "LABEL"},
		{"EXPOSE", "FROM a\nEXPOSE 80\n", 2, "EXPOSE"},
		{"USER", "FROM a\nUSER nobody\n", 2, "USER"},
		{"VOLUME", "FROM a\nVOLUME /data\n", 2, "VOLUME"},
		{"SHELL", "FROM a\nSHELL [\"bash\"]\n", 2, "SHELL"},
		{"HEALTHCHECK", "FROM a\nHEALTHCHECK NONE\n", 2, "HEALTHCHECK"},
		{"ONBUILD", "FROM a\nONBUILD RUN x\n", 2, "ONBUILD"},
		{"STOPSIGNAL", "FROM a\nSTOPSIGNAL 9\n", 2, "STOPSIGNAL"},
		{"MAINTAINER", "FROM a\nMAINTAINER me\n", 2, "MAINTAINER"},
		{"unknown", "FROM a\nFROBNICATE x\n", 2, "unknown instruction"},
		{"escape directive", "# escape=`\nFROM a\n", 1, "escape parser directive"},
		{"RUN empty", "FROM a\nRUN\n", 2, "RUN needs arguments"},
		{"RUN flag", "FROM a\nRUN --mount=type=cache,target=/x true\n", 2, "--mount=type=cache,target=/x: flags"},
		{"RUN heredoc", "FROM a\nRUN <<EOF\necho\nEOF\n", 2, "heredoc"},
		{"RUN bad JSON", "FROM a\nRUN [\"a\", 1]\n", 2, "JSON form"},
		{"RUN empty JSON", "FROM a\nRUN []\n", 2, "no command"},
		{"line of continued RUN", "FROM a\nRUN a \\\n  b\nRUN --network=none c\n", 4, "flags"},
		{"COPY one arg", "FROM a\nCOPY x\n", 2, "source and a destination"},
		{"COPY --from", "FROM a\nCOPY --from=build /x /x\n", 2, "--from=build: flags"},
		{"COPY --chown", "FROM a\nCOPY --chown=1:1 x /x\n", 2, "flags"},
		{"COPY absolute src", "FROM a\nCOPY /etc/passwd /x\n", 2, "relative to the build context"},
		{"COPY dotdot", "FROM a\nCOPY ../secret /x\n", 2, "may not contain .."},
		{"COPY inner dotdot", "FROM a\nCOPY a/../../b /x\n", 2, "may not contain .."},
		{"COPY wildcard", "FROM a\nCOPY *.go /src/\n", 2, "wildcards"},
		{"COPY URL", "FROM a\nCOPY http://x/y /y\n", 2, "URLs"},
		{"COPY several to a file", "FROM a\nCOPY a b /dst\n", 2, "ending in /"},
		{"COPY relative dst without WORKDIR", "FROM a\nCOPY a dst\n", 2, "no WORKDIR"},
		{"COPY heredoc", "FROM a\nCOPY <<EOF /x\n", 2, "heredoc"},
		{"COPY unset variable", "FROM a\nCOPY $SRC /x\n", 2, "$SRC is not set"},
		{"ENV no value", "FROM a\nENV KEY\n", 2, "needs a value"},
		{"ENV bad key", "FROM a\nENV 1A=x\n", 2, "bad variable name"},
		{"ENV empty key", "FROM a\nENV =x\n", 2, "empty variable name"},
		{"ENV mixed forms", "FROM a\nENV A=1 B\n", 2, "is not KEY=VALUE"},
		{"ENV unterminated quote", "FROM a\nENV A=\"x\n", 2, "unterminated"},
		{"ENV unset variable", "FROM a\nENV PATH=/x:$PATH\n", 2, "$PATH is not set"},
		{"ENV unsupported expansion", "FROM a\nENV A=${B%x}\n", 2, "bad variable reference"},
		{"ENV unsupported operator", "FROM a\nENV B=1\nENV A=${B:=x}\n", 3, "only ${VAR}"},
		{"WORKDIR relative first", "FROM a\nWORKDIR src\n", 2, "no WORKDIR"},
		{"WORKDIR unset variable", "FROM a\nWORKDIR $HOME\n", 2, "$HOME is not set"},
		{"instruction without FROM after comment", "# c\nENV A=1\n", 2, "ENV before FROM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDockerfile(strings.NewReader(tc.file), "Dockerfile")
			var de *DockerfileError
			if !errors.As(err, &de) {
				t.Fatalf("err %v, want a *DockerfileError", err)
			}
			prefix := "Dockerfile:" + strconv.Itoa(tc.line) + ": "
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err %q, want %q…%q", err, prefix, tc.msg)
			}
		})
	}
}

func TestParseDockerfileNamesTheFile(t *testing.T) {
	_, err := ParseDockerfile(strings.NewReader("FROM a\nADD x y\n"), "build/Containerfile")
	if err == nil || !strings.HasPrefix(err.Error(), "build/Containerfile:2: ") {
		t.Errorf("%v", err)
	}
}
