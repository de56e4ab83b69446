package httpapi

import (
	"regexp"
	"strings"
)

var pathParam = regexp.MustCompile(`\{([a-z]+)(\.\.\.)?\}`)

// requestSchemas are the JSON bodies of the endpoints that take one.
var requestSchemas = map[string]map[string]any{
	"create": obj(map[string]any{
		"timeout_s":      num("idle timeout in seconds"),
		"max_lifetime_s": num("maximum lifetime in seconds"),
		"limits":         limitsSchema,
		"env":            strMap("environment variables"),
		"metadata":       strMap("free-form labels"),
	}),
	"timeout": obj(map[string]any{"timeout_s": num("new idle timeout from now, seconds")}),
	"execute": obj(map[string]any{
		"code":       str("Python code"),
		"timeout_s":  num("wall-clock limit for this execution"),
		"cpu_time_s": num("CPU time limit for this execution"),
		"env":        strMap("environment for this execution"),
		"stream":     map[string]any{"type": "boolean", "description": "stream NDJSON events (or send Accept: application/x-ndjson)"},
	}),
	"command": obj(map[string]any{
		"cmd":       str("shell command, run with /bin/sh -c"),
		"cwd":       str("working directory (default /workspace)"),
		"env":       strMap("environment"),
		"timeout_s": num("wall-clock limit"),
		"stream":    map[string]any{"type": "boolean"},
	}),
	"runOnce": obj(map[string]any{
		"code":      str("Python code"),
		"files":     strMap("files to place in the workspace: name → base64 content"),
		"limits":    limitsSchema,
		"timeout_s": num("wall-clock limit"),
		"env":       strMap("environment"),
		"stream":    map[string]any{"type": "boolean"},
	}),
}

var limitsSchema = obj(map[string]any{
	"memory":     num("bytes"),
	"cpu_time_s": num("CPU seconds per execution"),
	"timeout_s":  num("wall-clock seconds per execution"),
	"pids":       num("processes and threads"),
	"disk":       num("bytes of /workspace, /tmp and /dev/shm"),
	"max_output": num("bytes kept per stream"),
})

func obj(props map[string]any) map[string]any {
	return map[string]any{"type": "object", "properties": props, "additionalProperties": false}
}
func num(d string) map[string]any { return map[string]any{"type": "number", "description": d} }
func str(d string) map[string]any { return map[string]any{"type": "string", "description": d} }
func strMap(d string) map[string]any {
	return map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}, "description": d}
}

// OpenAPI returns the API's OpenAPI 3.1 document, built from Routes so
// that it always matches what the server serves.
func OpenAPI() map[string]any {
	paths := map[string]any{}
	for _, r := range Routes {
		p := pathParam.ReplaceAllString(r.Pattern, "{$1}")
		item, _ := paths[p].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[p] = item
		}
		op := map[string]any{
			"operationId": r.Name,
			"summary":     r.Summary,
			"responses": map[string]any{
				"200":     map[string]any{"description": "success"},
				"default": map[string]any{"description": "error", "content": jsonContent(errorSchema)},
			},
		}
		var params []any
		for _, m := range pathParam.FindAllStringSubmatch(r.Pattern, -1) {
			params = append(params, map[string]any{"name": m[1], "in": "path", "required": true, "schema": str("")})
		}
		if r.Name == "listFiles" {
			params = append(params,
				map[string]any{"name": "path", "in": "query", "schema": str("directory, relative to the workspace")},
				map[string]any{"name": "depth", "in": "query", "schema": num("levels to list, 1-64")})
		}
		if params != nil {
			op["parameters"] = params
		}
		if schema, ok := requestSchemas[r.Name]; ok {
			op["requestBody"] = map[string]any{"content": jsonContent(schema)}
		}
		if r.Name == "putFile" {
			op["requestBody"] = map[string]any{"content": map[string]any{"application/octet-stream": map[string]any{}}}
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

var errorSchema = obj(map[string]any{"error": obj(map[string]any{"code": str("machine-readable kind"), "message": str("")})})

func jsonContent(schema map[string]any) map[string]any {
	return map[string]any{"application/json": map[string]any{"schema": schema}}
}
