package httpapi

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

var pathParam = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\{([a-z]+)(\.\.\.)?\}`) })

// operation says what one route takes and answers: Go values whose types
// the schemas are derived from, so the document cannot drift from the
// code.
type operation struct {
	request  any // JSON body, or nil
	status   int // success status
	response any // JSON body; nil for none
	stream   bool
	raw      string // a non-JSON response's content type
}

var operations = map[string]operation{
	"health":         {status: 200, response: okResponse{}},
	"metrics":        {status: 200, raw: "text/plain"},
	"openapi":        {status: 200, response: map[string]any{}},
	"create":         {request: createRequest{}, status: 201, response: service.Info{}},
	"list":           {status: 200, response: sandboxList{}},
	"get":            {status: 200, response: service.Info{}},
	"delete":         {status: 204},
	"timeout":        {request: timeoutRequest{}, status: 200, response: service.Info{}},
	"pause":          {status: 200, response: service.Info{}},
	"resume":         {status: 200, response: service.Info{}},
	"fork":           {request: forkRequest{}, status: 201, response: sandboxList{}},
	"usage":          {status: 200, response: usageList{}},
	"createSnapshot": {request: snapshotRequest{}, status: 201, response: service.SnapshotInfo{}},
	"listSnapshots":  {status: 200, response: snapshotList{}},
	"getSnapshot":    {status: 200, response: service.SnapshotInfo{}},
	"deleteSnapshot": {status: 204},
	"exportSnapshot": {status: 200, raw: "application/x-tar"},
	"importSnapshot": {status: 201, response: service.SnapshotInfo{}},
	"execute":        {request: executeRequest{}, status: 200, response: service.ExecResult{}, stream: true},
	"interrupt":      {status: 200, response: okResponse{}},
	"restart":        {status: 200, response: restartResponse{}},
	"command":        {request: commandRequest{}, status: 200, response: service.CommandResult{}, stream: true},
	"installPackage": {request: packageRequest{}, status: 200, response: service.PackageResult{}},
	"setNetwork":     {request: netpolicy.Request{}, status: 200, response: service.Info{}},
	"listFiles":      {status: 200, response: fileList{}},
	"putFile":        {status: 201, response: fileWritten{}},
	"getFile":        {status: 200, raw: "application/octet-stream"},
	"deleteFile":     {status: 204},
	"runOnce":        {request: runOnceRequest{}, status: 200, response: sandbox.Result{}, stream: true},

	"listContexts":   {status: 200, response: contextList{}},
	"createContext":  {request: contextRequest{}, status: 201, response: sandbox.CodeContext{}},
	"deleteContext":  {status: 204},
	"restartContext": {status: 200, response: okResponse{}},
	"listProcesses":  {status: 200, response: processList{}},
	"startProcess":   {request: processRequest{}, status: 201, response: service.ProcessInfo{}},
	"processOutput":  {status: 200, stream: true},
	"processStdin":   {status: 200, response: okResponse{}},
	"signalProcess":  {request: signalRequest{}, status: 200, response: okResponse{}},
	"resizeProcess":  {request: sandbox.TerminalSize{}, status: 200, response: okResponse{}},
	"portToken":      {request: portTokenRequest{}, status: 200, response: portAccess{}},

	"rotateAccessToken": {status: 200, response: accessToken{}},
	"revokeKey":         {request: revokeRequest{}, status: 200, response: revokeResponse{}},

	"createVolume":     {request: volumeRequest{}, status: 201, response: volume.Volume{}},
	"listVolumes":      {status: 200, response: volumeList{}},
	"getVolume":        {status: 200, response: volume.Volume{}},
	"deleteVolume":     {status: 204},
	"listVolumeFiles":  {status: 200, response: fileList{}},
	"putVolumeFile":    {status: 201, response: fileWritten{}},
	"getVolumeFile":    {status: 200, raw: "application/octet-stream"},
	"deleteVolumeFile": {status: 204},
}

// streamEvent documents the NDJSON events of a streamed execution.
type streamEvent struct {
	Type    string          `json:"type" doc:"stdout, stderr, result, error or end"`
	Text    string          `json:"text,omitempty" doc:"output (stdout, stderr)"`
	Result  *sandbox.Output `json:"result,omitempty" doc:"a rich result (result)"`
	Error   *sandbox.Error  `json:"error,omitempty" doc:"the exception (error), or why the request failed (end)"`
	Summary any             `json:"summary,omitempty" doc:"the complete result, as without streaming (end); for a process, how it ended"`
}

type errorBody struct {
	Error struct {
		Code    string `json:"code" doc:"machine-readable kind: invalid_request, not_found, busy, quota, too_large ..."`
		Message string `json:"message" doc:"what went wrong and what to do, for the caller"`
	} `json:"error"`
}

// OpenAPI returns the API's OpenAPI 3.1 document, built from Routes and the
// Go types of every request and response.
func OpenAPI() map[string]any {
	paths := map[string]any{}
	for _, r := range Routes {
		p := pathParam().ReplaceAllString(r.Pattern, "{$1}")
		item, _ := paths[p].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[p] = item
		}
		o := operations[r.Name]
		ok := map[string]any{"description": "success"}
		content := map[string]any{}
		if o.response != nil {
			content["application/json"] = map[string]any{"schema": schemaOf(reflect.TypeOf(o.response))}
		}
		if o.stream {
			content["application/x-ndjson"] = map[string]any{"schema": schemaOf(reflect.TypeOf(streamEvent{}))}
		}
		if o.raw != "" {
			content[o.raw] = map[string]any{}
		}
		if len(content) > 0 {
			ok["content"] = content
		}
		op := map[string]any{
			"operationId": r.Name,
			"summary":     r.Summary,
			"responses": map[string]any{
				itoa(o.status): ok,
				"default": map[string]any{"description": "error (400, 401, 403, 404, 409, 413, 422, 429, 503)",
					"content": map[string]any{"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(errorBody{}))}}},
			},
		}
		var params []any
		for _, m := range pathParam().FindAllStringSubmatch(r.Pattern, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": map[string]any{"type": "string"}})
		}
		if r.Name == "listFiles" || r.Name == "listVolumeFiles" {
			params = append(params,
				map[string]any{"name": "path", "in": "query", "schema": map[string]any{"type": "string", "description": "directory, relative to the workspace"}},
				map[string]any{"name": "depth", "in": "query", "schema": map[string]any{"type": "integer", "minimum": 1, "maximum": 64}})
		}
		if params != nil {
			op["parameters"] = params
		}
		if o.request != nil {
			op["requestBody"] = map[string]any{"content": map[string]any{"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(o.request))}}}
		}
		if r.Name == "putFile" || r.Name == "putVolumeFile" || r.Name == "processStdin" {
			op["requestBody"] = map[string]any{"content": map[string]any{"application/octet-stream": map[string]any{}}}
		}
		if r.Name == "processStdin" {
			params = append(params, map[string]any{"name": "close", "in": "query",
				"schema": map[string]any{"type": "string", "description": "1: close stdin after the body is written"}})
			op["parameters"] = params
		}
		if !r.Public {
			op["security"] = []any{map[string]any{"bearer": []any{}}}
		}
		item[strings.ToLower(r.Method)] = op
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info":    map[string]any{"title": "Vivarium", "version": "1", "description": "Sandboxes for untrusted Python"},
		"paths":   paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
		},
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

var (
	timeType = reflect.TypeOf(time.Time{})
	rawType  = reflect.TypeOf(json.RawMessage{})
)

// schemaOf derives a JSON Schema from a Go type the way encoding/json
// encodes it: json tags name the properties, a doc tag describes them.
func schemaOf(t reflect.Type) map[string]any {
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == rawType:
		return map[string]any{"description": "any JSON value"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		s := schemaOf(t.Elem())
		if typ, ok := s["type"].(string); ok {
			s["type"] = []any{typ, "null"}
		}
		return s
	case reflect.Interface:
		return map[string]any{}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
	case reflect.Struct:
		props := map[string]any{}
		addFields(t, props)
		return map[string]any{"type": "object", "properties": props}
	}
	return map[string]any{}
}

func addFields(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			addFields(ft, props)
			continue
		}
		if name == "" {
			name = f.Name
		}
		s := schemaOf(f.Type)
		if d := f.Tag.Get("doc"); d != "" {
			s["description"] = d
		}
		props[name] = s
	}
}
