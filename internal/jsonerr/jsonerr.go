// Package jsonerr turns encoding/json's errors into messages for an API's
// clients: where in their JSON the problem is and what was expected, in
// JSON's terms ("limits.memory: expected an integer, got a string"), never
// in Go's (struct names, Go types, "json: cannot unmarshal").
package jsonerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// Message describes a decoding error for the client who sent the JSON.
func Message(err error) string {
	if err == nil {
		return ""
	}
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON ends too early"
	case errors.As(err, &syntax):
		return fmt.Sprintf("invalid JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.As(err, &typ):
		got, value, _ := strings.Cut(typ.Value, " ")
		if value != "" {
			got += " " + value
		} else {
			got = article(got)
		}
		msg := fmt.Sprintf("expected %s, got %s", expected(typ.Type), got)
		if typ.Field != "" {
			msg = typ.Field + ": " + msg
		}
		return msg
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return "unknown field " + rest
	}
	// Errors of the types' own decoders (base64, enumerations) are
	// written for clients already; the package's own prefix is not.
	return strings.TrimPrefix(msg, "json: ")
}

// expected names what a Go type accepts, in JSON's terms.
func expected(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer in range"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return expected(t.Elem())
	}
	return "another value"
}

func article(kind string) string {
	switch kind {
	case "array", "object":
		return "an " + kind
	case "bool":
		return "true or false"
	case "":
		return "another value"
	}
	return "a " + kind
}
