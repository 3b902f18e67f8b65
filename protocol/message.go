package protocol

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Kind is which of JSON-RPC's three shapes a message has.
type Kind int

// The three shapes.
const (
	KindRequest      Kind = iota + 1 // method + id (+ params)
	KindNotification                 // method, no id
	KindResponse                     // result xor error, + id
)

// Message is one decoded frame.
type Message struct {
	Kind Kind
	ID   int64
	// HasID is false for a notification, and for an error response whose id is null (it
	// answers a frame whose id could not be read).
	HasID  bool
	Method string // a request's or notification's method; a result's echoed method
	// Params is the typed params of a request (*ExecParams, *InitParams, …, or Empty).
	Params any
	// Result is the typed result of a successful response (*ExecResult, …, or Empty).
	Result any
	// Err is the error of an error response.
	Err *Error
}

// Decode reads one frame's document as a message, refusing exactly what PROTOCOL.md's
// "What is refused when reading" lists. A refusal is an *Error carrying the code to answer
// with (-32700 for a document that is not BSON, -32600 for a malformed envelope, -32601 for
// an unknown method, -32602 for params a method does not take), and the id when one could
// be read. Unknown members are ignored, member order is free, a null id or params reads as
// absent.
func Decode(doc []byte) (*Message, error) {
	d := bsoncore.Document(doc)
	if err := validateDocument(d, 0); err != nil {
		return nil, Errorf(CodeParseError, "not a BSON document: %v", err)
	}
	m := &Message{}
	refuse := func(code Code, format string, args ...any) (*Message, error) {
		e := Errorf(code, format, args...)
		e.ID, e.HasID = m.ID, m.HasID
		return nil, e
	}

	id, hasID, err := getInt(d, "id")
	if err != nil {
		return refuse(CodeInvalidRequest, "id: want an integer")
	}
	m.ID, m.HasID = id, hasID

	version, ok, err := getString(d, "jsonrpc")
	if err != nil || !ok || version != "2.0" {
		return refuse(CodeInvalidRequest, `jsonrpc must be "2.0"`)
	}
	method, hasMethod, err := getString(d, "method")
	if err != nil {
		return refuse(CodeInvalidRequest, "method: want a string")
	}
	m.Method = method
	params, hasParams := lookup(d, "params")
	result, hasResult := lookup(d, "result")
	errVal, hasError := lookup(d, "error")

	if hasResult || hasError {
		m.Kind = KindResponse
		switch {
		case hasResult && hasError:
			return refuse(CodeInvalidRequest, "result and error together")
		case hasParams:
			return refuse(CodeInvalidRequest, "params and a response member together: a message cannot be both a request and a response")
		case hasResult && !hasID:
			// An error may have a null id: it answers a frame whose id could not be
			// read (JSON-RPC's rule, and what AppendError writes without one).
			return refuse(CodeInvalidRequest, "a result with no id")
		}
		if hasError {
			if hasMethod {
				return refuse(CodeInvalidRequest, "method together with error: an error names no method")
			}
			ed, ok := errVal.DocumentOK()
			if !ok {
				return refuse(CodeInvalidRequest, "error: want a document")
			}
			code, ok, err := getInt(ed, "code")
			if err != nil || !ok {
				return refuse(CodeInvalidRequest, "error: code: want an integer")
			}
			msg, _, err := getString(ed, "message")
			if err != nil {
				return refuse(CodeInvalidRequest, "error: %v", err)
			}
			m.Err = &Error{Code: Code(code), Message: msg}
			return m, nil
		}
		if !hasMethod {
			return refuse(CodeInvalidRequest, "a result with no method to type it")
		}
		info, known := methodTable[method]
		if !known || info.result == nil {
			return refuse(CodeInvalidRequest, "a result for %q, which is not a method that answers", method)
		}
		rd, ok := result.DocumentOK()
		if !ok {
			return refuse(CodeInvalidRequest, "result: want a document")
		}
		if m.Result, err = info.result(rd); err != nil {
			return refuse(CodeInvalidRequest, "%s result: %v", method, err)
		}
		return m, nil
	}

	if !hasMethod {
		return refuse(CodeInvalidRequest, "neither a method nor a result or error")
	}
	info, known := methodTable[method]
	if !known {
		return refuse(CodeMethodNotFound, "method %q not found", method)
	}
	if IsNotification(method) {
		if hasID {
			return refuse(CodeInvalidRequest, "%s is a notification and takes no id", method)
		}
		m.Kind = KindNotification
		m.Params = Empty{}
		return m, nil
	}
	if !hasID {
		return refuse(CodeInvalidRequest, "%s is a request and needs an id", method)
	}
	m.Kind = KindRequest
	pd := bsoncore.Document(emptyDoc)
	if hasParams {
		if pd, ok = params.DocumentOK(); !ok {
			return refuse(CodeInvalidParams, "params: want a document, got %s", params.Type)
		}
	}
	if m.Params, err = info.params(pd); err != nil {
		return refuse(CodeInvalidParams, "%s: %v", method, err)
	}
	return m, nil
}

var emptyDoc = []byte{5, 0, 0, 0, 0}

// AppendRequest appends a request document. params nil is sent as an empty document, as
// the upstream peers do.
func AppendRequest(dst []byte, id int64, method string, params Payload) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "jsonrpc", "2.0")
	dst = bsoncore.AppendInt64Element(dst, "id", id)
	dst = bsoncore.AppendStringElement(dst, "method", method)
	if params == nil {
		params = Empty{}
	}
	dst = params.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "params"))
	return docEnd(dst, idx)
}

// AppendNotification appends a notification document (no id, no params).
func AppendNotification(dst []byte, method string) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "jsonrpc", "2.0")
	dst = bsoncore.AppendStringElement(dst, "method", method)
	return docEnd(dst, idx)
}

// AppendResult appends a successful response, echoing the method it answers.
func AppendResult(dst []byte, id int64, method string, result Payload) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "jsonrpc", "2.0")
	dst = bsoncore.AppendInt64Element(dst, "id", id)
	dst = bsoncore.AppendStringElement(dst, "method", method)
	dst = result.AppendBSON(bsoncore.AppendHeader(dst, bsoncore.TypeEmbeddedDocument, "result"))
	return docEnd(dst, idx)
}

// AppendError appends an error response. Without an id (a message whose id could not be
// read) the id is null, as JSON-RPC has it. An error carries no method.
func AppendError(dst []byte, id int64, hasID bool, e *Error) []byte {
	idx, dst := docStart(dst)
	dst = bsoncore.AppendStringElement(dst, "jsonrpc", "2.0")
	if hasID {
		dst = bsoncore.AppendInt64Element(dst, "id", id)
	} else {
		dst = bsoncore.AppendNullElement(dst, "id")
	}
	eidx, dst := bsoncore.AppendDocumentElementStart(dst, "error")
	dst = bsoncore.AppendInt64Element(dst, "code", int64(e.Code))
	dst = bsoncore.AppendStringElement(dst, "message", e.Message)
	dst = docEnd(dst, eidx)
	return docEnd(dst, idx)
}

// String is for logs: the shape, id and method.
func (m *Message) String() string {
	switch m.Kind {
	case KindNotification:
		return "notification " + m.Method
	case KindRequest:
		return fmt.Sprintf("request %d %s", m.ID, m.Method)
	}
	if m.Err != nil {
		return fmt.Sprintf("error %d %s", m.ID, m.Err)
	}
	return fmt.Sprintf("result %d %s", m.ID, m.Method)
}
