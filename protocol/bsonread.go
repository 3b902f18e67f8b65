package protocol

import (
	"encoding/binary"
	"fmt"
	"math"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Readers for one member of a document. Each returns present=false for a member that is
// missing or null (null reads as absent, as the upstream peers write an unset option), and
// an error naming the member when it is there with a type the wire does not allow.

func lookup(doc bsoncore.Document, key string) (bsoncore.Value, bool) {
	v, err := doc.LookupErr(key)
	if err != nil || v.Type == bsoncore.TypeNull || v.Type == bsoncore.TypeUndefined {
		return bsoncore.Value{}, false
	}
	return v, true
}

func getString(doc bsoncore.Document, key string) (string, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return "", false, nil
	}
	s, ok := v.StringValueOK()
	if !ok {
		return "", true, fmt.Errorf("%s: want a string, got %s", key, v.Type)
	}
	return s, true, nil
}

// getInt accepts Int32 or Int64 (the upstream peers use both, by field), and a Double
// only when it holds an exact integer (a JavaScript peer may have no other number).
func getInt(doc bsoncore.Document, key string) (int64, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return 0, false, nil
	}
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), true, nil
	case bsoncore.TypeInt64:
		return v.Int64(), true, nil
	case bsoncore.TypeDouble:
		f := v.Double()
		if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return int64(f), true, nil
		}
	}
	return 0, true, fmt.Errorf("%s: want an integer, got %s", key, v.Type)
}

// getUint is getInt for a member that may not be negative.
func getUint(doc bsoncore.Document, key string) (uint64, bool, error) {
	n, ok, err := getInt(doc, key)
	if err != nil || !ok {
		return 0, ok, err
	}
	if n < 0 {
		return 0, true, fmt.Errorf("%s: %d is negative", key, n)
	}
	return uint64(n), true, nil
}

func getBool(doc bsoncore.Document, key string) (bool, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return false, false, nil
	}
	b, ok := v.BooleanOK()
	if !ok {
		return false, true, fmt.Errorf("%s: want a boolean, got %s", key, v.Type)
	}
	return b, true, nil
}

// getBytes reads Binary of any subtype, or an array of integers 0..255 (how the upstream
// client may send init's snapshot). A Binary aliases the document it was read from.
func getBytes(doc bsoncore.Document, key string) ([]byte, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return nil, false, nil
	}
	switch v.Type {
	case bsoncore.TypeBinary:
		_, data, ok := v.BinaryOK()
		if !ok {
			return nil, true, fmt.Errorf("%s: malformed binary", key)
		}
		if data == nil {
			data = []byte{}
		}
		return data, true, nil
	case bsoncore.TypeArray:
		vals, err := v.Array().Values()
		if err != nil {
			return nil, true, fmt.Errorf("%s: %v", key, err)
		}
		out := make([]byte, len(vals))
		for i, e := range vals {
			n, ok := e.AsInt64OK()
			if !ok || (e.Type != bsoncore.TypeInt32 && e.Type != bsoncore.TypeInt64) || n < 0 || n > 255 {
				return nil, true, fmt.Errorf("%s[%d]: want a byte (0..255)", key, i)
			}
			out[i] = byte(n)
		}
		return out, true, nil
	}
	return nil, true, fmt.Errorf("%s: want binary, got %s", key, v.Type)
}

func getStrings(doc bsoncore.Document, key string) ([]string, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return nil, false, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, true, fmt.Errorf("%s: want an array of strings, got %s", key, v.Type)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, true, fmt.Errorf("%s: %v", key, err)
	}
	out := make([]string, len(vals))
	for i, e := range vals {
		s, ok := e.StringValueOK()
		if !ok {
			return nil, true, fmt.Errorf("%s[%d]: want a string, got %s", key, i, e.Type)
		}
		out[i] = s
	}
	return out, true, nil
}

func getDoc(doc bsoncore.Document, key string) (bsoncore.Document, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return nil, false, nil
	}
	d, ok := v.DocumentOK()
	if !ok {
		return nil, true, fmt.Errorf("%s: want a document, got %s", key, v.Type)
	}
	return d, true, nil
}

func getDocs(doc bsoncore.Document, key string) ([]bsoncore.Document, bool, error) {
	v, ok := lookup(doc, key)
	if !ok {
		return nil, false, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, true, fmt.Errorf("%s: want an array of documents, got %s", key, v.Type)
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, true, fmt.Errorf("%s: %v", key, err)
	}
	out := make([]bsoncore.Document, len(vals))
	for i, e := range vals {
		d, ok := e.DocumentOK()
		if !ok {
			return nil, true, fmt.Errorf("%s[%d]: want a document, got %s", key, i, e.Type)
		}
		out[i] = d
	}
	return out, true, nil
}

// fieldReader collects the first error of a run of member reads, so a decoder reads as a
// list of members rather than a ladder of ifs.
type fieldReader struct {
	doc bsoncore.Document
	err error
}

func (r *fieldReader) keep(err error) {
	if r.err == nil && err != nil {
		r.err = err
	}
}

func (r *fieldReader) str(key string, required bool) string {
	s, ok, err := getString(r.doc, key)
	r.keep(err)
	if required && !ok {
		r.keep(fmt.Errorf("%s: missing", key))
	}
	return s
}

func (r *fieldReader) uintPtr(key string) *uint64 {
	n, ok, err := getUint(r.doc, key)
	r.keep(err)
	if !ok || err != nil {
		return nil
	}
	return &n
}

func (r *fieldReader) boolPtr(key string) *bool {
	b, ok, err := getBool(r.doc, key)
	r.keep(err)
	if !ok || err != nil {
		return nil
	}
	return &b
}

func (r *fieldReader) bytes(key string) []byte {
	b, _, err := getBytes(r.doc, key)
	r.keep(err)
	return b
}

func (r *fieldReader) strings(key string) []string {
	s, _, err := getStrings(r.doc, key)
	r.keep(err)
	return s
}

// maxDepth bounds how deeply documents may nest. The deepest message this protocol has
// (a build_image recipe's copy step) is seven levels; the bound is there so that a
// hostile frame of nested empty documents cannot recurse the reader into the ground.
const maxDepth = 100

// validateDocument checks that d is exactly one well-formed BSON document, all the way
// down: bsoncore's Document.Validate checks only the top level (an embedded document's
// length is trusted, not its contents) and accepts bytes after the document's end. Member
// readers below treat a lookup that fails as a missing member, so a corrupt embedded
// document would otherwise read as one with members left out rather than as the parse
// error it is.
func validateDocument(d []byte, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("documents nested deeper than %d", maxDepth)
	}
	if len(d) < 5 {
		return fmt.Errorf("%d bytes is shorter than the empty document", len(d))
	}
	if n := int32(binary.LittleEndian.Uint32(d)); int64(n) != int64(len(d)) {
		return fmt.Errorf("document says it is %d bytes, and %d are there", n, len(d))
	}
	if d[len(d)-1] != 0 {
		return fmt.Errorf("document does not end in a terminator")
	}
	body := d[4 : len(d)-1]
	for len(body) > 0 {
		elem, rest, ok := bsoncore.ReadElement(body)
		if !ok {
			return fmt.Errorf("malformed element at byte %d", len(d)-1-len(body))
		}
		v := elem.Value()
		switch v.Type {
		case bsoncore.TypeEmbeddedDocument, bsoncore.TypeArray:
			if err := validateDocument(v.Data, depth+1); err != nil {
				return fmt.Errorf("%s: %w", elem.Key(), err)
			}
		case bsoncore.TypeString:
			// length (including the terminator), bytes, terminator
			if int32(binary.LittleEndian.Uint32(v.Data)) < 1 || v.Data[len(v.Data)-1] != 0 {
				return fmt.Errorf("%s: malformed string", elem.Key())
			}
		case bsoncore.TypeBinary:
			if _, _, ok := v.BinaryOK(); !ok {
				return fmt.Errorf("%s: malformed binary", elem.Key())
			}
		}
		body = rest
	}
	return nil
}
