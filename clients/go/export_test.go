package ringlock

// Views of a client's state for the external tests (package ringlock_test),
// compiled only into the tests.

// UsableConnections is the number of the client's connections that are up.
func UsableConnections(c *Client) int {
	usable := 0
	for _, connection := range c.router.topology.Load().connections {
		if connection.usable() {
			usable++
		}
	}
	return usable
}

// RequestsWaitingForConnection is the number of requests that wait for a
// usable connection.
func RequestsWaitingForConnection(c *Client) int {
	c.router.retriesMu.Lock()
	defer c.router.retriesMu.Unlock()
	waiting := 0
	for o := range c.router.retries {
		if !o.waitingSince.IsZero() {
			waiting++
		}
	}
	return waiting
}

// ClusterScore is the score of key on the cluster called name, checked
// against clients/cluster-hash-vectors.json.
var ClusterScore = clusterScore
