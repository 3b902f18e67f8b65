package image

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"

	"virtx.dev/virtx/protocol"
)

// DockerfileError is a refusal of one line of a Dockerfile. Its message reads
// `Dockerfile:LINE: what is wrong`.
type DockerfileError struct {
	File string // as given to ParseDockerfile, usually "Dockerfile"
	Line int    // 1-based, the first line of the instruction
	Msg  string
}

func (e *DockerfileError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// subset names what ParseDockerfile accepts, for refusals.
const subset = "the supported subset is one FROM, then RUN, COPY, ENV and WORKDIR"

// refusedInstructions are Dockerfile instructions outside the subset, with why or what to
// do instead.
var refusedInstructions = map[string]string{
	"ADD":         "ADD is not supported: use COPY (and RUN to fetch or unpack)",
	"ARG":         "ARG is not supported: use ENV",
	"CMD":         "CMD is not supported: a session runs the commands it is given",
	"ENTRYPOINT":  "ENTRYPOINT is not supported: a session runs the commands it is given",
	"LABEL":       "LABEL is not supported",
	"MAINTAINER":  "MAINTAINER is not supported",
	"EXPOSE":      "EXPOSE is not supported: publish ports when the session starts",
	"USER":        "USER is not supported: sessions run as root",
	"VOLUME":      "VOLUME is not supported: mount trees when the session starts",
	"SHELL":       "SHELL is not supported: RUN uses sh -c",
	"HEALTHCHECK": "HEALTHCHECK is not supported",
	"ONBUILD":     "ONBUILD is not supported",
	"STOPSIGNAL":  "STOPSIGNAL is not supported",
}

// heredoc matches the start of a BuildKit heredoc (`<<EOF`, `<<-"EOF"`).
var heredoc = regexp.MustCompile(`<<-?["']?[A-Za-z_]`)

// ParseDockerfile reads a one-stage Dockerfile subset into a Recipe. file names the
// Dockerfile in errors (e.g. "Dockerfile").
//
// Accepted: `FROM image [AS name]` first and once; `RUN cmd` and `RUN ["prog", "arg"]`
// (exec form is shell-quoted into a command); `COPY src… dst` and its JSON form (each
// source is its own step; several sources need a dst ending in /); `ENV K V` and
// `ENV K=V [K2="v 2"…]`; `WORKDIR dir`. A relative COPY destination or WORKDIR joins
// onto the last WORKDIR of the file. `$VAR`, `${VAR}`, `${VAR:-default}` and
// `${VAR:+alt}` in ENV, COPY and WORKDIR expand from the ENVs above them (RUN is left to
// the shell, which gets the environment). Lines end in `\` to continue; `#` starts a
// comment line. Everything else is refused with a *DockerfileError.
func ParseDockerfile(r io.Reader, file string) (*protocol.Recipe, error) {
	if file == "" {
		file = "Dockerfile"
	}
	p := &dfParser{file: file, env: map[string]string{}}
	lines, err := logicalLines(r, file)
	if err != nil {
		return nil, err
	}
	for _, l := range lines {
		if err := p.instruction(l); err != nil {
			return nil, err
		}
	}
	if p.recipe == nil {
		return nil, &DockerfileError{File: file, Line: max(1, p.lastLine), Msg: "no FROM: " + subset}
	}
	if err := p.recipe.Validate(); err != nil {
		return nil, &DockerfileError{File: file, Line: p.lastLine, Msg: err.Error()}
	}
	return p.recipe, nil
}

type logicalLine struct {
	n    int // first physical line
	text string
}

// logicalLines joins continuations and drops comments and blank lines.
func logicalLines(r io.Reader, file string) ([]logicalLine, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	var out []logicalLine
	var cur strings.Builder
	start, n := 0, 0
	directives := true
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			if directives && cur.Len() == 0 {
				key, val, ok := strings.Cut(strings.TrimSpace(trimmed[1:]), "=")
				if ok && strings.EqualFold(strings.TrimSpace(key), "escape") && strings.TrimSpace(val) != `\` {
					return nil, &DockerfileError{File: file, Line: n, Msg: "the escape parser directive is not supported (the escape character is \\)"}
				}
			}
			continue // comments vanish, also inside a continued instruction
		}
		directives = false
		if trimmed == "" && cur.Len() == 0 {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, ok := strings.CutSuffix(strings.TrimRight(line, " \t"), `\`); ok {
			cur.WriteString(body)
			continue
		}
		cur.WriteString(line)
		out = append(out, logicalLine{n: start, text: strings.TrimSpace(cur.String())})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if cur.Len() > 0 {
		if t := strings.TrimSpace(cur.String()); t != "" {
			out = append(out, logicalLine{n: start, text: t})
		}
	}
	return out, nil
}

type dfParser struct {
	file     string
	recipe   *protocol.Recipe
	env      map[string]string // ENVs so far, for substitution
	workdir  string            // last WORKDIR, "" when none
	lastLine int
}

func (p *dfParser) fail(line int, format string, args ...any) error {
	return &DockerfileError{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)}
}

func (p *dfParser) instruction(l logicalLine) error {
	p.lastLine = l.n
	word, rest, _ := strings.Cut(l.text, " ")
	if i := strings.IndexAny(l.text, " \t"); i >= 0 {
		word, rest = l.text[:i], l.text[i+1:]
	} else {
		word, rest = l.text, ""
	}
	inst := strings.ToUpper(word)
	rest = strings.TrimSpace(rest)
	if why, ok := refusedInstructions[inst]; ok {
		return p.fail(l.n, "%s", why)
	}
	switch inst {
	case "FROM", "RUN", "COPY", "ENV", "WORKDIR":
	default:
		return p.fail(l.n, "unknown instruction %q: %s", word, subset)
	}
	if inst == "FROM" {
		return p.from(l.n, rest)
	}
	if p.recipe == nil {
		return p.fail(l.n, "%s before FROM: the first instruction must be FROM", inst)
	}
	if rest == "" {
		return p.fail(l.n, "%s needs arguments", inst)
	}
	if inst != "ENV" && inst != "WORKDIR" && strings.HasPrefix(rest, "--") {
		flag, _, _ := strings.Cut(rest, " ")
		return p.fail(l.n, "%s %s: flags are not supported", inst, flag)
	}
	switch inst {
	case "RUN":
		return p.run(l.n, rest)
	case "COPY":
		return p.copy(l.n, rest)
	case "ENV":
		return p.envInst(l.n, rest)
	}
	return p.workdirInst(l.n, rest)
}

func (p *dfParser) from(line int, rest string) error {
	if p.recipe != nil {
		return p.fail(line, "a second FROM: multi-stage builds are not supported")
	}
	if strings.HasPrefix(rest, "--") {
		flag, _, _ := strings.Cut(rest, " ")
		return p.fail(line, "FROM %s: flags are not supported", flag)
	}
	f := strings.Fields(rest)
	switch {
	case len(f) == 0:
		return p.fail(line, "FROM needs an image")
	case len(f) == 2 || len(f) > 3 || (len(f) == 3 && !strings.EqualFold(f[1], "AS")):
		return p.fail(line, "FROM takes an image and optionally AS NAME, not %q", rest)
	}
	if strings.Contains(f[0], "$") {
		return p.fail(line, "FROM %s: variables are not supported in FROM", f[0])
	}
	if f[0] != "scratch" {
		if _, err := ParseReference(f[0]); err != nil {
			return p.fail(line, "FROM: %v", err)
		}
	}
	p.recipe = &protocol.Recipe{Base: f[0]}
	return nil
}

func (p *dfParser) add(s protocol.Step) { p.recipe.Steps = append(p.recipe.Steps, s) }

func (p *dfParser) run(line int, rest string) error {
	if heredoc.MatchString(rest) {
		return p.fail(line, "RUN with a heredoc is not supported")
	}
	if argv, ok, err := jsonForm(rest); ok {
		if err != nil {
			return p.fail(line, "RUN: %v", err)
		}
		if len(argv) == 0 {
			return p.fail(line, "RUN [] has no command")
		}
		q := make([]string, len(argv))
		for i, a := range argv {
			q[i] = shellQuote(a)
		}
		p.add(protocol.Step{Kind: protocol.StepRun, Run: strings.Join(q, " ")})
		return nil
	}
	p.add(protocol.Step{Kind: protocol.StepRun, Run: rest})
	return nil
}

// jsonForm reports whether s is written in JSON (exec) form, and parses it.
func jsonForm(s string) ([]string, bool, error) {
	if !strings.HasPrefix(s, "[") {
		return nil, false, nil
	}
	var argv []string
	if err := json.Unmarshal([]byte(s), &argv); err != nil {
		if strings.HasSuffix(s, "]") {
			return nil, true, fmt.Errorf("JSON form %s: want an array of strings", s)
		}
		return nil, false, nil // a shell command that starts with [ (test)
	}
	return argv, true, nil
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,+@%", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (p *dfParser) copy(line int, rest string) error {
	args, isJSON, err := jsonForm(rest)
	if err != nil {
		return p.fail(line, "COPY: %v", err)
	}
	if !isJSON {
		if heredoc.MatchString(rest) {
			return p.fail(line, "COPY with a heredoc is not supported")
		}
		for _, f := range strings.Fields(rest) {
			w, err := p.expand(f, false)
			if err != nil {
				return p.fail(line, "COPY: %v", err)
			}
			args = append(args, w)
		}
	}
	if len(args) < 2 {
		return p.fail(line, "COPY needs a source and a destination")
	}
	srcs, dst := args[:len(args)-1], args[len(args)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dst, "/") {
		return p.fail(line, "COPY with several sources needs a destination ending in /, not %q", dst)
	}
	if !path.IsAbs(dst) {
		if p.workdir == "" {
			return p.fail(line, "COPY destination %q is relative and no WORKDIR is set above it: write an absolute path", dst)
		}
		slash := strings.HasSuffix(dst, "/")
		dst = path.Join(p.workdir, dst)
		if slash && dst != "/" {
			dst += "/"
		}
	}
	for _, src := range srcs {
		switch {
		case src == "" || path.IsAbs(src):
			return p.fail(line, "COPY source %q must be a path relative to the build context", src)
		case hasDotDot(src):
			return p.fail(line, "COPY source %q may not contain ..", src)
		case strings.ContainsAny(src, "*?["):
			return p.fail(line, "COPY source %q: wildcards are not supported", src)
		case strings.Contains(src, "://"):
			return p.fail(line, "COPY source %q: URLs are not supported", src)
		}
		p.add(protocol.Step{Kind: protocol.StepCopy, Src: src, Dst: dst})
	}
	return nil
}

func hasDotDot(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return true
		}
	}
	return false
}

func (p *dfParser) envInst(line int, rest string) error {
	key, val, hasSpace := strings.Cut(rest, " ")
	if i := strings.IndexAny(rest, " \t"); i >= 0 {
		key, val = rest[:i], rest[i+1:]
	}
	if !strings.Contains(key, "=") {
		// ENV KEY VALUE: the rest of the line is the value.
		if !hasSpace && !strings.ContainsAny(rest, "\t") || strings.TrimSpace(val) == "" {
			return p.fail(line, "ENV %s needs a value (ENV KEY VALUE or ENV KEY=VALUE)", key)
		}
		if err := checkEnvKey(key); err != nil {
			return p.fail(line, "ENV: %v", err)
		}
		v, err := p.expand(strings.TrimSpace(val), true)
		if err != nil {
			return p.fail(line, "ENV %s: %v", key, err)
		}
		p.setEnv(key, v)
		return nil
	}
	words, err := p.words(rest)
	if err != nil {
		return p.fail(line, "ENV: %v", err)
	}
	set := make([][2]string, 0, len(words))
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return p.fail(line, "ENV: %q is not KEY=VALUE (in the KEY=VALUE form every word is one)", w)
		}
		if err := checkEnvKey(k); err != nil {
			return p.fail(line, "ENV: %v", err)
		}
		set = append(set, [2]string{k, v})
	}
	for _, kv := range set { // all substitutions above used the env before this line
		p.setEnv(kv[0], kv[1])
	}
	return nil
}

func checkEnvKey(k string) error {
	if k == "" {
		return fmt.Errorf("empty variable name")
	}
	for i, r := range k {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return fmt.Errorf("bad variable name %q", k)
		}
	}
	return nil
}

func (p *dfParser) setEnv(k, v string) {
	p.env[k] = v
	p.add(protocol.Step{Kind: protocol.StepEnv, Key: k, Value: v})
}

func (p *dfParser) workdirInst(line int, rest string) error {
	dir, err := p.expand(rest, true)
	if err != nil {
		return p.fail(line, "WORKDIR: %v", err)
	}
	if dir == "" {
		return p.fail(line, "WORKDIR needs a directory")
	}
	if !path.IsAbs(dir) {
		if p.workdir == "" {
			return p.fail(line, "WORKDIR %q is relative and no WORKDIR is set above it: write an absolute path", dir)
		}
		dir = path.Join(p.workdir, dir)
	}
	dir = path.Clean(dir)
	p.workdir = dir
	p.add(protocol.Step{Kind: protocol.StepWorkdir, Workdir: dir})
	return nil
}

// words splits s into shell-like words: whitespace separates, "…" and '…' quote, \
// escapes, and $VAR expands (not inside '…').
func (p *dfParser) words(s string) ([]string, error) {
	var out []string
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return out, nil
		}
		w, n, err := p.lex(s, false)
		if err != nil {
			return nil, err
		}
		out = append(out, w)
		s = s[n:]
	}
}

// expand processes one word; with keepSpace, whitespace does not end it.
func (p *dfParser) expand(s string, keepSpace bool) (string, error) {
	w, _, err := p.lex(s, keepSpace)
	return w, err
}

// lex reads one word from s and returns it and how many bytes of s it used.
func (p *dfParser) lex(s string, keepSpace bool) (string, int, error) {
	var b strings.Builder
	i := 0
	var quote byte
	for i < len(s) {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				b.WriteByte(c)
			}
			i++
		case c == '\\':
			if i+1 >= len(s) {
				b.WriteByte(c)
				i++
				continue
			}
			next := s[i+1]
			if quote == '"' && next != '"' && next != '\\' && next != '$' {
				b.WriteByte(c)
			}
			b.WriteByte(next)
			i += 2
		case c == '$':
			v, n, err := p.variable(s[i:])
			if err != nil {
				return "", 0, err
			}
			b.WriteString(v)
			i += n
		case quote == '"':
			if c == '"' {
				quote = 0
			} else {
				b.WriteByte(c)
			}
			i++
		case c == '"' || c == '\'':
			quote = c
			i++
		case (c == ' ' || c == '\t') && !keepSpace:
			return b.String(), i, nil
		default:
			b.WriteByte(c)
			i++
		}
	}
	if quote != 0 {
		return "", 0, fmt.Errorf("unterminated %c quote", quote)
	}
	return b.String(), i, nil
}

// variable expands the reference at the start of s ("$NAME", "${NAME}", "${NAME:-x}",
// "${NAME:+x}") from the ENVs so far; one that is not set, with no default, is an error:
// the base image's environment is not known here, so an empty expansion could be wrong.
func (p *dfParser) variable(s string) (string, int, error) {
	if len(s) < 2 {
		return "$", 1, nil
	}
	if s[1] == '{' {
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return "", 0, fmt.Errorf("unterminated ${ in %q", s)
		}
		body := s[2:end]
		nm, op, word := body, "", ""
		if i := strings.Index(body, ":"); i >= 0 {
			nm, op, word = body[:i], body[i:i+2], body[i+2:]
			if op != ":-" && op != ":+" {
				return "", 0, fmt.Errorf("${%s}: only ${VAR}, ${VAR:-default} and ${VAR:+alt} are supported", body)
			}
		}
		if checkEnvKey(nm) != nil {
			return "", 0, fmt.Errorf("bad variable reference ${%s}", body)
		}
		v, set := p.env[nm]
		switch {
		case op == ":-" && (!set || v == ""):
			return word, end + 1, nil
		case op == ":+":
			if set && v != "" {
				return word, end + 1, nil
			}
			return "", end + 1, nil
		case !set:
			return "", 0, unsetVar(nm)
		}
		return v, end + 1, nil
	}
	n := 1
	for n < len(s) && (s[n] == '_' || s[n] >= 'a' && s[n] <= 'z' || s[n] >= 'A' && s[n] <= 'Z' || n > 1 && s[n] >= '0' && s[n] <= '9') {
		n++
	}
	if n == 1 {
		return "$", 1, nil
	}
	v, ok := p.env[s[1:n]]
	if !ok {
		return "", 0, unsetVar(s[1:n])
	}
	return v, n, nil
}

func unsetVar(name string) error {
	return fmt.Errorf("$%s is not set by an ENV above it (the base image's environment is not known when the Dockerfile is read; write the value, or ${%s:-default})", name, name)
}
