package e2b

import "github.com/vivarium-sandbox/vivarium/internal/route"

// Prefix is where `vivarium serve` mounts the API (Config.Prefix):
// E2B_API_URL=http://HOST:PORT/e2b and
// E2B_SANDBOX_URL=http://HOST:PORT/e2b/sandbox.
const Prefix = "/e2b"

// SignedFilesPath is where `vivarium serve` mounts SignedFiles: E2B's SDKs
// build signed file URLs at the root of the sandbox URL's host, whatever
// its path.
const SignedFilesPath = "/files"

// Routes are the control plane's routes, below the prefix: New serves
// these and no others there (route.Mux).
var Routes = []route.Route{
	{Method: "POST", Path: "/sandboxes", Forward: route.Create},
	{Method: "POST", Path: "/v2/sandboxes", Forward: route.Create},
	{Method: "GET", Path: "/sandboxes", Forward: route.Every("")},
	{Method: "GET", Path: "/v2/sandboxes", Forward: route.Every("")},
	{Method: "GET", Path: "/sandboxes/{id}", Forward: route.Sandbox},
	{Method: "DELETE", Path: "/sandboxes/{id}", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/timeout", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/refreshes", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/connect", Forward: route.Sandbox},
	{Method: "POST", Path: "/v2/sandboxes/{id}/connect", Forward: route.Sandbox},
	{Method: "GET", Path: "/sandboxes/{id}/metrics", Forward: route.Sandbox},
	// The latest metrics of the sandboxes named in the query: each node
	// answers for those it holds.
	{Method: "GET", Path: "/sandboxes/metrics", Forward: route.Every("sandboxes")},
	{Method: "PUT", Path: "/sandboxes/{id}/network", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/pause", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/resume", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/fork", Forward: route.Sandbox},
	{Method: "GET", Path: "/sandboxes/{id}/logs", Forward: route.Sandbox},
	{Method: "GET", Path: "/v2/sandboxes/{id}/logs", Forward: route.Sandbox},
	{Method: "POST", Path: "/sandboxes/{id}/snapshots", Forward: route.Sandbox},
	{Method: "GET", Path: "/snapshots", Forward: route.Every("")},
	// A snapshot, by its template id (SnapshotRef), else a template of
	// the key's; other templates are E2B's cloud, which any node says.
	{Method: "DELETE", Path: "/templates/{id}", Forward: route.TemplateOrSnapshot},
	// Template builds (templates.go). A build and its template live on
	// the node that made them, which a cluster's template ids name; a
	// key's builds are made on its node (route.Key), and their images
	// shared through the cluster's template registry.
	{Method: "POST", Path: "/v3/templates", Forward: route.Key},
	{Method: "GET", Path: "/templates/{templateID}/files/{hash}", Forward: route.Template},
	{Method: "PUT", Path: "/templates/{templateID}/files/{hash}", Forward: route.Template},
	{Method: "POST", Path: "/v2/templates/{templateID}/builds/{buildID}", Forward: route.Template},
	{Method: "GET", Path: "/templates/{templateID}/builds/{buildID}/status", Forward: route.Template},
	{Method: "GET", Path: "/templates/{templateID}/{what}", Forward: route.Template},
	{Method: "POST", Path: "/templates/tags", Forward: route.Key},
	{Method: "DELETE", Path: "/templates/tags", Forward: route.Key},
	{Method: "POST", Path: "/volumes", Forward: route.NewVolume},
	{Method: "GET", Path: "/volumes", Forward: route.Every("")},
	{Method: "GET", Path: "/volumes/{volumeID}", Forward: route.Volume},
	{Method: "DELETE", Path: "/volumes/{volumeID}", Forward: route.Volume},
	{Method: "GET", Path: "/volumecontent/{volumeID}/dir", Forward: route.VolumeID},
	{Method: "POST", Path: "/volumecontent/{volumeID}/dir", Forward: route.VolumeID},
	{Method: "GET", Path: "/volumecontent/{volumeID}/path", Forward: route.VolumeID},
	{Method: "PATCH", Path: "/volumecontent/{volumeID}/path", Forward: route.VolumeID},
	{Method: "DELETE", Path: "/volumecontent/{volumeID}/path", Forward: route.VolumeID},
	{Method: "GET", Path: "/volumecontent/{volumeID}/file", Forward: route.VolumeID},
	{Method: "PUT", Path: "/volumecontent/{volumeID}/file", Forward: route.VolumeID},
	// Everything else (templates, secrets, teams): E2B's cloud, not
	// Vivarium's, which any node says in E2B's terms.
	{Path: "/", Forward: route.Pick},
}

// ClusterRoutes are the API's routes as `vivarium serve` mounts it (at
// Prefix, signed file URLs at SignedFilesPath), as a cluster's gateway
// forwards them: the control plane's, the data plane below sandboxPath
// whose sandbox is in a header, and signed file URLs.
func ClusterRoutes() []route.Route {
	out := []route.Route{
		{Path: Prefix + sandboxPath + "/", Forward: route.SandboxHeader},
		{Path: SignedFilesPath, Forward: route.Signed},
	}
	for _, r := range Routes {
		r.Path = Prefix + r.Path
		out = append(out, r)
	}
	return out
}

// SnapshotRef is the snapshot an E2B template id names: an id, a name,
// or "" for E2B's own templates (KnownTemplates) and what is neither. A
// cluster's gateway finds the node of a creation, or of a template's
// deletion, by it.
func SnapshotRef(template string) string { return snapshotRef(template) }
