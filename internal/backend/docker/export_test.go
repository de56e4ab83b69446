package docker

import (
	"context"
	"net/url"
)

// Containers lists the containers of the daemon at host with the owner
// label name (all, running or not), for tests to find leftovers.
func Containers(host, name string) ([]string, error) {
	c, err := dial(context.Background(), host)
	if err != nil {
		return nil, err
	}
	defer c.http.CloseIdleConnections()
	var list []struct {
		ID string `json:"Id"`
	}
	q := url.Values{"all": {"1"}, "filters": {`{"label":["` + labelOwner + `=` + name + `"]}`}}
	if err := c.call(context.Background(), "GET", "/containers/json", q, nil, &list); err != nil {
		return nil, err
	}
	var ids []string
	for _, ct := range list {
		ids = append(ids, ct.ID)
	}
	return ids, nil
}

// ImageTar exposes imageTar.
var ImageTar = imageTar

// AgentTasks exposes agentTasks.
const AgentTasks = agentTasks
