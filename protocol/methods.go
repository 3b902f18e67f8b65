package protocol

import (
	"fmt"
	"math"
	"path"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// The methods. Requests are answered; notifications (start, stop, quit) are not.
const (
	MethodVersion     = "version"
	MethodBuildImage  = "build_image"
	MethodRemoveImage = "remove_image"
	MethodListImages  = "list_images"
	MethodInit        = "init"
	MethodExec        = "exec"
	MethodRead        = "read"
	MethodWrite       = "write"
	MethodSnapshot    = "snapshot"
	MethodStart       = "start"
	MethodStop        = "stop"
	MethodQuit        = "quit"
)

// IsNotification reports whether method is one that is never answered.
func IsNotification(method string) bool {
	return method == MethodStart || method == MethodStop || method == MethodQuit
}

// Payload is a method's params or result: it appends itself as one BSON document.
type Payload interface {
	AppendBSON(dst []byte) []byte
}

// document builds a BSON document in place: start, then members, then end.
func docStart(dst []byte) (int32, []byte) { return bsoncore.AppendDocumentStart(dst) }

func docEnd(dst []byte, idx int32) []byte {
	dst, _ = bsoncore.AppendDocumentEnd(dst, idx) // fails only for an index we did not make
	return dst
}

func appendStrings(dst []byte, key string, vals []string) []byte {
	idx, dst := bsoncore.AppendArrayElementStart(dst, key)
	for i, s := range vals {
		dst = bsoncore.AppendStringElement(dst, arrayKey(i), s)
	}
	return docEnd(dst, idx)
}

func arrayKey(i int) string {
	if i < len(smallKeys) {
		return smallKeys[i]
	}
	return fmt.Sprint(i)
}

var smallKeys = func() []string {
	k := make([]string, 64)
	for i := range k {
		k[i] = fmt.Sprint(i)
	}
	return k
}()

func appendBinary(dst []byte, key string, b []byte) []byte {
	return bsoncore.AppendBinaryElement(dst, key, 0, b)
}

// Empty is the params of a method that takes none, and the result of remove_image.
type Empty struct{}

func (Empty) AppendBSON(dst []byte) []byte { idx, dst := docStart(dst); return docEnd(dst, idx) }

// ---- version ----

// VersionResult answers version.
type VersionResult struct{ Version string }

func (r *VersionResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "version", r.Version)
	return docEnd(dst, idx)
}

// ---- images ----

// Recipe is a base image and the steps over it (build_image, and an ImageSource of type
// recipe).
type Recipe struct {
	Base  string
	Steps []Step
}

// StepKind says which of a Step's members is set.
type StepKind string

// The kinds of recipe step.
const (
	StepRun     StepKind = "run"
	StepCopy    StepKind = "copy"
	StepEnv     StepKind = "env"
	StepWorkdir StepKind = "workdir"
)

// Step is one recipe step: run a shell command, copy from the build context, set an
// environment variable, or set the working directory.
type Step struct {
	Kind    StepKind
	Run     string // run: the `sh -c` command
	Src     string // copy: relative to the build context, no ".."
	Dst     string // copy: absolute in the image
	Key     string // env
	Value   string // env
	Workdir string // workdir: absolute
}

func (s Step) String() string {
	switch s.Kind {
	case StepRun:
		return "RUN " + s.Run
	case StepCopy:
		return "COPY " + s.Src + " " + s.Dst
	case StepEnv:
		return "ENV " + s.Key + "=" + s.Value
	case StepWorkdir:
		return "WORKDIR " + s.Workdir
	}
	return string(s.Kind)
}

// Validate checks what the wire allows a recipe to say.
func (r *Recipe) Validate() error {
	if r.Base == "" {
		return fmt.Errorf("recipe: base is empty")
	}
	for i, s := range r.Steps {
		var err error
		switch s.Kind {
		case StepRun:
			if strings.TrimSpace(s.Run) == "" {
				err = fmt.Errorf("run: empty command")
			}
		case StepCopy:
			switch {
			case s.Src == "" || path.IsAbs(s.Src):
				err = fmt.Errorf("copy: src %q must be a path relative to the build context", s.Src)
			case hasDotDot(s.Src):
				err = fmt.Errorf("copy: src %q may not contain ..", s.Src)
			case !path.IsAbs(s.Dst):
				err = fmt.Errorf("copy: dst %q must be absolute", s.Dst)
			}
		case StepEnv:
			if s.Key == "" || strings.ContainsAny(s.Key, "=\x00") {
				err = fmt.Errorf("env: bad key %q", s.Key)
			}
		case StepWorkdir:
			if !path.IsAbs(s.Workdir) {
				err = fmt.Errorf("workdir: %q must be absolute", s.Workdir)
			}
		default:
			err = fmt.Errorf("unknown step kind %q", s.Kind)
		}
		if err != nil {
			return fmt.Errorf("recipe: step %d: %w", i+1, err)
		}
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

func (r *Recipe) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "v", 1)
	dst = bsoncore.AppendStringElement(dst, "base", r.Base)
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "steps")
	for i, s := range r.Steps {
		sidx, d := bsoncore.AppendDocumentElementStart(dst, arrayKey(i))
		dst = d
		switch s.Kind {
		case StepRun:
			dst = bsoncore.AppendStringElement(dst, "run", s.Run)
		case StepCopy:
			cidx, d := bsoncore.AppendDocumentElementStart(dst, "copy")
			d = bsoncore.AppendStringElement(d, "src", s.Src)
			d = bsoncore.AppendStringElement(d, "dst", s.Dst)
			dst = docEnd(d, cidx)
		case StepEnv:
			eidx, d := bsoncore.AppendDocumentElementStart(dst, "env")
			d = bsoncore.AppendStringElement(d, "key", s.Key)
			d = bsoncore.AppendStringElement(d, "value", s.Value)
			dst = docEnd(d, eidx)
		case StepWorkdir:
			dst = bsoncore.AppendStringElement(dst, "workdir", s.Workdir)
		}
		dst = docEnd(dst, sidx)
	}
	dst = docEnd(dst, aidx)
	return docEnd(dst, idx)
}

func decodeRecipe(doc bsoncore.Document) (*Recipe, error) {
	v, ok, err := getInt(doc, "v")
	if err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	if !ok || v != 1 {
		return nil, fmt.Errorf("recipe: v must be 1")
	}
	r := &Recipe{}
	base, _, err := getString(doc, "base")
	if err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	r.Base = base
	steps, _, err := getDocs(doc, "steps")
	if err != nil {
		return nil, fmt.Errorf("recipe: %w", err)
	}
	for i, sd := range steps {
		s, err := decodeStep(sd)
		if err != nil {
			return nil, fmt.Errorf("recipe: step %d: %w", i+1, err)
		}
		r.Steps = append(r.Steps, s)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

func decodeStep(doc bsoncore.Document) (Step, error) {
	elems, err := doc.Elements()
	if err != nil {
		return Step{}, err
	}
	if len(elems) != 1 {
		return Step{}, fmt.Errorf("want exactly one of run, copy, env, workdir; got %d members", len(elems))
	}
	key := elems[0].Key()
	switch StepKind(key) {
	case StepRun, StepWorkdir:
		s, _, err := getString(doc, key)
		if err != nil {
			return Step{}, err
		}
		if key == "run" {
			return Step{Kind: StepRun, Run: s}, nil
		}
		return Step{Kind: StepWorkdir, Workdir: s}, nil
	case StepCopy, StepEnv:
		sub, _, err := getDoc(doc, key)
		if err != nil {
			return Step{}, err
		}
		r := &fieldReader{doc: sub}
		if key == "copy" {
			s := Step{Kind: StepCopy, Src: r.str("src", true), Dst: r.str("dst", true)}
			return s, r.err
		}
		s := Step{Kind: StepEnv, Key: r.str("key", true), Value: r.str("value", true)}
		return s, r.err
	}
	return Step{}, fmt.Errorf("unknown step %q", key)
}

// ImageSource names an image to run on: a recipe to build, a ref, or a digest.
type ImageSource struct {
	Type   string // "recipe", "ref" or "digest"
	Recipe *Recipe
	Ref    string
	Digest string
}

// The ImageSource types.
const (
	ImageRecipe = "recipe"
	ImageRef    = "ref"
	ImageDigest = "digest"
)

func (s *ImageSource) String() string {
	switch s.Type {
	case ImageRecipe:
		return "recipe on " + s.Recipe.Base
	case ImageRef:
		return s.Ref
	}
	return s.Digest
}

func (s *ImageSource) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "type", s.Type)
	switch s.Type {
	case ImageRecipe:
		dst = s.Recipe.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "recipe"))
	case ImageRef:
		dst = bsoncore.AppendStringElement(dst, "ref", s.Ref)
	case ImageDigest:
		dst = bsoncore.AppendStringElement(dst, "digest", s.Digest)
	}
	return docEnd(dst, idx)
}

func decodeImageSource(doc bsoncore.Document) (*ImageSource, error) {
	t, _, err := getString(doc, "type")
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	s := &ImageSource{Type: t}
	switch t {
	case ImageRecipe:
		rd, ok, err := getDoc(doc, "recipe")
		if err != nil || !ok {
			return nil, fmt.Errorf("image: recipe: want a document")
		}
		if s.Recipe, err = decodeRecipe(rd); err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
	case ImageRef:
		if s.Ref, _, err = getString(doc, "ref"); err != nil || s.Ref == "" {
			return nil, fmt.Errorf("image: ref: want a non-empty string")
		}
	case ImageDigest:
		if s.Digest, _, err = getString(doc, "digest"); err != nil || !ValidDigest(s.Digest) {
			return nil, fmt.Errorf("image: digest: want \"sha256:<64 hex digits>\"")
		}
	default:
		return nil, fmt.Errorf("image: type %q: want recipe, ref or digest", t)
	}
	return s, nil
}

// ValidDigest reports whether d is "sha256:" and 64 lowercase hex digits.
func ValidDigest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// BuildImageParams asks for a recipe to be built, and optionally named.
type BuildImageParams struct {
	Recipe *Recipe
	Ref    string // optional
}

func (p *BuildImageParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = p.Recipe.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "recipe"))
	if p.Ref != "" {
		dst = bsoncore.AppendStringElement(dst, "ref", p.Ref)
	}
	return docEnd(dst, idx)
}

// BuildImageResult answers build_image.
type BuildImageResult struct{ Ref, Digest string }

func (r *BuildImageResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "ref", r.Ref)
	dst = bsoncore.AppendStringElement(dst, "digest", r.Digest)
	return docEnd(dst, idx)
}

// RemoveImageParams names an image to drop.
type RemoveImageParams struct{ Image *ImageSource }

func (p *RemoveImageParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = p.Image.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "image"))
	return docEnd(dst, idx)
}

// ImageEntry is one image a server holds.
type ImageEntry struct {
	Digest string
	Refs   []string
}

// ListImagesResult answers list_images.
type ListImagesResult struct{ Images []ImageEntry }

func (r *ListImagesResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	aidx, dst := bsoncore.AppendArrayElementStart(dst, "images")
	for i, e := range r.Images {
		eidx, d := bsoncore.AppendDocumentElementStart(dst, arrayKey(i))
		d = bsoncore.AppendStringElement(d, "digest", e.Digest)
		if len(e.Refs) > 0 {
			d = appendStrings(d, "refs", e.Refs)
		}
		dst = docEnd(d, eidx)
	}
	dst = docEnd(dst, aidx)
	return docEnd(dst, idx)
}

// ---- init ----

// InitParams is the session: what it can reach and the machine it runs on. A nil pointer
// is a member left out.
type InitParams struct {
	Image        *ImageSource
	Snapshot     []byte // nil: none
	Network      *bool  // nil: on
	Ports        []Port
	VCPUs        *uint64
	MemoryMiB    *uint64
	GPU          *bool
	GPUMemoryMiB *uint64
	DiskGiB      *uint64
	Mounts       []Mount
}

func (p *InitParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	if p.Image != nil {
		dst = p.Image.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "image"))
	}
	if p.Snapshot != nil {
		dst = appendBinary(dst, "snapshot", p.Snapshot)
	}
	if p.Network != nil {
		dst = bsoncore.AppendBooleanElement(dst, "network", *p.Network)
	}
	if len(p.Ports) > 0 {
		ports := make([]string, len(p.Ports))
		for i, pt := range p.Ports {
			ports[i] = pt.String()
		}
		dst = appendStrings(dst, "ports", ports)
	}
	if p.VCPUs != nil {
		dst = bsoncore.AppendInt32Element(dst, "vcpus", int32(min(*p.VCPUs, 1<<31-1)))
	}
	if p.MemoryMiB != nil {
		dst = bsoncore.AppendInt64Element(dst, "memory_mib", int64(*p.MemoryMiB))
	}
	if p.GPU != nil {
		dst = bsoncore.AppendBooleanElement(dst, "gpu", *p.GPU)
	}
	if p.GPUMemoryMiB != nil {
		dst = bsoncore.AppendInt64Element(dst, "gpu_memory_mib", int64(*p.GPUMemoryMiB))
	}
	if p.DiskGiB != nil {
		dst = bsoncore.AppendInt64Element(dst, "disk_gib", int64(*p.DiskGiB))
	}
	if len(p.Mounts) > 0 {
		mounts := make([]string, len(p.Mounts))
		for i, m := range p.Mounts {
			mounts[i] = m.String()
		}
		dst = appendStrings(dst, "mounts", mounts)
	}
	return docEnd(dst, idx)
}

func decodeInitParams(doc bsoncore.Document) (*InitParams, error) {
	r := &fieldReader{doc: doc}
	p := &InitParams{
		Snapshot:     r.bytes("snapshot"),
		Network:      r.boolPtr("network"),
		VCPUs:        r.uintPtr("vcpus"),
		MemoryMiB:    r.uintPtr("memory_mib"),
		GPU:          r.boolPtr("gpu"),
		GPUMemoryMiB: r.uintPtr("gpu_memory_mib"),
		DiskGiB:      r.uintPtr("disk_gib"),
	}
	if p.VCPUs != nil && *p.VCPUs > math.MaxInt32 {
		// An Int32 on the wire (upstream: a u8); a count that does not fit is not one.
		r.keep(fmt.Errorf("vcpus: %d does not fit the wire's Int32", *p.VCPUs))
	}
	for _, s := range r.strings("ports") {
		pt, err := ParsePort(s)
		r.keep(err)
		p.Ports = append(p.Ports, pt)
	}
	for _, s := range r.strings("mounts") {
		m, err := ParseMount(s)
		r.keep(err)
		p.Mounts = append(p.Mounts, m)
	}
	if d, ok, err := getDoc(doc, "image"); err != nil {
		r.keep(err)
	} else if ok {
		img, err := decodeImageSource(d)
		r.keep(err)
		p.Image = img
	}
	if r.err != nil {
		return nil, r.err
	}
	return p, nil
}

// InitResult answers init: where the session stands.
type InitResult struct{ Cwd string }

func (r *InitResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	if r.Cwd != "" {
		dst = bsoncore.AppendStringElement(dst, "cwd", r.Cwd)
	}
	return docEnd(dst, idx)
}

// ---- exec ----

// ExecParams is a command, already split into argv, and an optional kill deadline.
type ExecParams struct {
	Cmd       []string
	TimeoutMS *uint64
	// Cwd is an extension member used only between a server and the executor inside a
	// boundary (internal/relay): where the session stands. A public client never sends
	// it, and a server ignores it if one does: the session's cwd is the server's.
	Cwd string
}

func (p *ExecParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = appendStrings(dst, "cmd", p.Cmd)
	if p.TimeoutMS != nil {
		dst = bsoncore.AppendInt64Element(dst, "timeout_ms", int64(*p.TimeoutMS))
	}
	if p.Cwd != "" {
		dst = bsoncore.AppendStringElement(dst, "cwd", p.Cwd)
	}
	return docEnd(dst, idx)
}

func decodeExecParams(doc bsoncore.Document) (*ExecParams, error) {
	r := &fieldReader{doc: doc}
	cmd, ok, err := getStrings(doc, "cmd")
	r.keep(err)
	p := &ExecParams{Cmd: cmd, TimeoutMS: r.uintPtr("timeout_ms"), Cwd: r.str("cwd", false)}
	if r.err != nil {
		return nil, r.err
	}
	if !ok || len(cmd) == 0 {
		return nil, fmt.Errorf("cmd: an empty argv runs nothing")
	}
	if p.TimeoutMS != nil && *p.TimeoutMS == 0 {
		return nil, fmt.Errorf("timeout_ms: 0 would kill the command before it starts; leave it out for no timeout")
	}
	return p, nil
}

// ExecResult is how a command ended.
type ExecResult struct {
	Code      int32
	Stdout    []byte
	Stderr    []byte
	Truncated bool
	// Cwd is an extension member, set only by an executor answering a server through
	// internal/relay: where the session stands after the command. Never sent to clients.
	Cwd string
}

func (r *ExecResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendInt32Element(dst, "code", r.Code)
	dst = appendBinary(dst, "stdout", r.Stdout)
	dst = appendBinary(dst, "stderr", r.Stderr)
	dst = bsoncore.AppendBooleanElement(dst, "truncated", r.Truncated)
	if r.Cwd != "" {
		dst = bsoncore.AppendStringElement(dst, "cwd", r.Cwd)
	}
	return docEnd(dst, idx)
}

// ---- read / write ----

// ReadParams asks for part of a file.
type ReadParams struct {
	Path   string
	Offset *uint64
	Len    *uint64
}

func (p *ReadParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "path", p.Path)
	if p.Offset != nil {
		dst = bsoncore.AppendInt64Element(dst, "offset", int64(*p.Offset))
	}
	if p.Len != nil {
		dst = bsoncore.AppendInt64Element(dst, "len", int64(*p.Len))
	}
	return docEnd(dst, idx)
}

// ReadResult is the bytes read and the file's size.
type ReadResult struct {
	Data []byte
	Size uint64
}

func (r *ReadResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = appendBinary(dst, "data", r.Data)
	dst = bsoncore.AppendInt64Element(dst, "size", int64(r.Size))
	return docEnd(dst, idx)
}

// WriteParams puts bytes in a file: replacing it (no Offset) or overwriting from Offset.
type WriteParams struct {
	Path   string
	Data   []byte
	Offset *uint64
}

func (p *WriteParams) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "path", p.Path)
	if len(p.Data) > 0 {
		dst = appendBinary(dst, "data", p.Data)
	}
	if p.Offset != nil {
		dst = bsoncore.AppendInt64Element(dst, "offset", int64(*p.Offset))
	}
	return docEnd(dst, idx)
}

// WriteResult is the file's size afterwards.
type WriteResult struct{ Size uint64 }

func (r *WriteResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendInt64Element(dst, "size", int64(r.Size))
	return docEnd(dst, idx)
}

// SnapshotResult is the session's writes as an OCI layer tar.
type SnapshotResult struct{ Blob []byte }

func (r *SnapshotResult) AppendBSON(dst []byte) []byte {
	idx, dst := docStart(dst)
	dst = appendBinary(dst, "blob", r.Blob)
	return docEnd(dst, idx)
}

// ---- the method table ----

type methodInfo struct {
	params func(bsoncore.Document) (any, error)
	result func(bsoncore.Document) (any, error)
}

func anyParams(bsoncore.Document) (any, error) { return Empty{}, nil }

var methodTable = map[string]methodInfo{
	MethodVersion: {anyParams, func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		return &VersionResult{Version: r.str("version", true)}, r.err
	}},
	MethodBuildImage: {func(d bsoncore.Document) (any, error) {
		rd, ok, err := getDoc(d, "recipe")
		if err != nil || !ok {
			return nil, fmt.Errorf("recipe: want a document")
		}
		recipe, err := decodeRecipe(rd)
		if err != nil {
			return nil, err
		}
		r := &fieldReader{doc: d}
		return &BuildImageParams{Recipe: recipe, Ref: r.str("ref", false)}, r.err
	}, func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		return &BuildImageResult{Ref: r.str("ref", true), Digest: r.str("digest", true)}, r.err
	}},
	MethodRemoveImage: {func(d bsoncore.Document) (any, error) {
		id, ok, err := getDoc(d, "image")
		if err != nil || !ok {
			return nil, fmt.Errorf("image: want a document")
		}
		img, err := decodeImageSource(id)
		if err != nil {
			return nil, err
		}
		return &RemoveImageParams{Image: img}, nil
	}, func(bsoncore.Document) (any, error) { return Empty{}, nil }},
	MethodListImages: {anyParams, func(d bsoncore.Document) (any, error) {
		docs, ok, err := getDocs(d, "images")
		if err != nil || !ok {
			return nil, fmt.Errorf("images: want an array of documents")
		}
		res := &ListImagesResult{Images: []ImageEntry{}}
		for _, e := range docs {
			r := &fieldReader{doc: e}
			ent := ImageEntry{Digest: r.str("digest", true), Refs: r.strings("refs")}
			if r.err != nil {
				return nil, fmt.Errorf("images: %w", r.err)
			}
			res.Images = append(res.Images, ent)
		}
		return res, nil
	}},
	MethodInit: {func(d bsoncore.Document) (any, error) { return decodeInitParams(d) },
		func(d bsoncore.Document) (any, error) {
			r := &fieldReader{doc: d}
			return &InitResult{Cwd: r.str("cwd", false)}, r.err
		}},
	MethodExec: {func(d bsoncore.Document) (any, error) { return decodeExecParams(d) },
		func(d bsoncore.Document) (any, error) {
			r := &fieldReader{doc: d}
			code, ok, err := getInt(d, "code")
			r.keep(err)
			if !ok || code < -1<<31 || code > 1<<31-1 {
				r.keep(fmt.Errorf("code: want an int32"))
			}
			res := &ExecResult{Code: int32(code), Stdout: r.bytes("stdout"), Stderr: r.bytes("stderr"), Cwd: r.str("cwd", false)}
			if b := r.boolPtr("truncated"); b != nil {
				res.Truncated = *b
			}
			return res, r.err
		}},
	MethodRead: {func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		p := &ReadParams{Path: r.str("path", true), Offset: r.uintPtr("offset"), Len: r.uintPtr("len")}
		if r.err == nil && p.Path == "" {
			r.keep(fmt.Errorf("path: empty"))
		}
		return p, r.err
	}, func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		res := &ReadResult{Data: r.bytes("data")}
		if n := r.uintPtr("size"); n != nil {
			res.Size = *n
		} else {
			r.keep(fmt.Errorf("size: missing"))
		}
		return res, r.err
	}},
	MethodWrite: {func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		p := &WriteParams{Path: r.str("path", true), Data: r.bytes("data"), Offset: r.uintPtr("offset")}
		if r.err == nil && p.Path == "" {
			r.keep(fmt.Errorf("path: empty"))
		}
		return p, r.err
	}, func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		n := r.uintPtr("size")
		if n == nil {
			r.keep(fmt.Errorf("size: missing"))
			return nil, r.err
		}
		return &WriteResult{Size: *n}, r.err
	}},
	MethodSnapshot: {anyParams, func(d bsoncore.Document) (any, error) {
		r := &fieldReader{doc: d}
		b, ok, err := getBytes(d, "blob")
		r.keep(err)
		if !ok {
			r.keep(fmt.Errorf("blob: missing"))
		}
		return &SnapshotResult{Blob: b}, r.err
	}},
	MethodStart: {anyParams, nil},
	MethodStop:  {anyParams, nil},
	MethodQuit:  {anyParams, nil},
}
