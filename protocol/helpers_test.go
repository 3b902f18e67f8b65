package protocol

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// marshal builds a document with the mongo driver's reflection-based encoder, which shares
// nothing with this package's hand-written appenders: what the tests compare against is
// what a third party writes for the same members in the same order.
func marshal(t testing.TB, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatalf("bson.Marshal: %v", err)
	}
	return b
}

// mustMarshal is marshal for package-level tables.
func mustMarshal(d bson.D) []byte {
	b, err := bson.Marshal(d)
	if err != nil {
		panic(err)
	}
	return b
}

// framed prefixes doc with its big-endian length, by hand.
func framed(doc []byte) []byte {
	out := make([]byte, 4, 4+len(doc))
	binary.BigEndian.PutUint32(out, uint32(len(doc)))
	return append(out, doc...)
}

// unhex reads a hex dump, ignoring whitespace and "|" separators.
func unhex(s string) []byte {
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "", "|", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

func bin(b string) bson.Binary { return bson.Binary{Subtype: 0, Data: []byte(b)} }

func u64(n uint64) *uint64 { return &n }
func ptrBool(b bool) *bool { return &b }

// cmpOpts treats a nil and an empty slice alike: on the wire a missing `data` and an
// empty Binary are the same fact ("omitted is empty").
var cmpOpts = []cmp.Option{cmpopts.EquateEmpty()}

// diffBytes reports the first differing offset of two byte strings, with hex around it.
func diffBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: bytes differ at offset %d (got %d bytes, want %d)\ngot:\n%s\nwant:\n%s",
		what, i, len(got), len(want), hex.Dump(got), hex.Dump(want))
}

// typeOf returns the BSON type of the member at the dotted path in doc.
func typeOf(t testing.TB, doc []byte, path ...string) bsoncore.Type {
	t.Helper()
	v, err := bsoncore.Document(doc).LookupErr(path...)
	if err != nil {
		t.Fatalf("lookup %v: %v", path, err)
	}
	return v.Type
}

// decodeOK decodes doc and fails the test on a refusal.
func decodeOK(t testing.TB, doc []byte) *Message {
	t.Helper()
	m, err := Decode(doc)
	if err != nil {
		t.Fatalf("Decode: %v\n%s", err, hex.Dump(doc))
	}
	return m
}

// decodeErr decodes doc and returns its refusal, failing the test if there is none.
func decodeErr(t testing.TB, doc []byte) *Error {
	t.Helper()
	m, err := Decode(doc)
	if err == nil {
		t.Fatalf("Decode accepted %+v, want a refusal", m)
	}
	e, ok := err.(*Error)
	if !ok {
		t.Fatalf("Decode: %T %v, want *Error", err, err)
	}
	return e
}
