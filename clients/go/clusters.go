package ringlock

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// ClustersMax is the most clusters NewClusters takes: every request scores
// its key on each of them.
const ClustersMax = 1024

// clusterScore is the score of key on the cluster called name:
// fmix64(fnv1a64(name ++ 0xFF ++ key)) (docs/protocol.md §4, "Several
// clusters"). The byte 0xFF is in no UTF-8 name, so (name, key) pairs
// never run together.
func clusterScore(name, key string) uint64 {
	hash := uint64(0xcbf29ce484222325)
	for i := 0; i < len(name); i++ {
		hash = (hash ^ uint64(name[i])) * 0x100000001b3
	}
	hash = (hash ^ 0xff) * 0x100000001b3
	for i := 0; i < len(key); i++ {
		hash = (hash ^ uint64(key[i])) * 0x100000001b3
	}
	// MurmurHash3's 64-bit finalizer spreads FNV's weak low bits.
	hash ^= hash >> 33
	hash *= 0xff51afd7ed558ccd
	hash ^= hash >> 33
	hash *= 0xc4ceb9fe1a85ec53
	return hash ^ hash>>33
}

// clusterIndex is the position in names of the cluster key goes to, or -1
// if names is empty.
func clusterIndex(names []string, key string) int {
	best, bestScore := -1, uint64(0)
	for i, name := range names {
		score := clusterScore(name, key)
		// Go compares strings byte by byte: the tie rule's byte order.
		if best < 0 || score > bestScore || (score == bestScore && name < names[best]) {
			best, bestScore = i, score
		}
	}
	return best
}

// ClusterFor is the name, among names, of the cluster key goes to: the
// highest score fmix64(fnv1a64(name ++ 0xFF ++ key)), a tie going to the
// name first in byte order (docs/protocol.md §4, "Several clusters"). Every
// ringlock client chooses the same cluster for the same key and names,
// whatever their order. It is "" only when names is empty.
func ClusterFor(names []string, key string) string {
	if i := clusterIndex(names, key); i >= 0 {
		return names[i]
	}
	return ""
}

// Clusters is a client of several independent ringlock clusters, each
// given by name: every request about a key goes to the key's cluster
// (ClusterFor over the names), so each cluster serves its own share of the
// keys and throughput adds up over the clusters. Safe for use by many
// goroutines at once.
//
// Each cluster is a *Client of its own nodes, dialled as usual; a Lock
// belongs to its cluster's client and is extended and released there.
// Fencing tokens come from the key's own cluster, so tokens of keys in
// different clusters are not comparable.
//
// Taking a cluster out of the list moves its keys to the others, where
// they are free: drain it first (docs/protocol.md §4): stop taking new
// locks on its keys, let its holders release or their leases end until its
// Stats shows no held keys, then make every application's Clusters
// without it.
type Clusters struct {
	// names in byte order, and clients in the same order.
	names   []string
	clients []*Client
}

// NewClusters makes a Clusters of the named clients. Errors: an
// *ArgumentError (errors.Is ErrBadArgument) when clusters is empty, holds
// more than ClustersMax, an empty name, a name holding the byte 0xFF, or a
// nil client.
func NewClusters(clusters map[string]*Client) (*Clusters, error) {
	bad := func(reason string) error { return &ArgumentError{Arg: "clusters", Reason: reason} }
	switch {
	case len(clusters) == 0:
		return nil, bad("give at least one cluster")
	case len(clusters) > ClustersMax:
		return nil, bad(fmt.Sprintf("give at most %d clusters", ClustersMax))
	}
	c := &Clusters{}
	for name := range clusters {
		c.names = append(c.names, name)
	}
	sort.Strings(c.names)
	for _, name := range c.names {
		switch {
		case name == "":
			return nil, bad("a cluster's name must not be empty")
		case strings.IndexByte(name, 0xff) >= 0:
			return nil, bad(fmt.Sprintf("the name %q holds the byte 0xFF", name))
		case clusters[name] == nil:
			return nil, bad(fmt.Sprintf("the cluster %q has no client", name))
		}
		c.clients = append(c.clients, clusters[name])
	}
	return c, nil
}

// ClientFor is the client of the cluster key goes to.
func (c *Clusters) ClientFor(key string) *Client {
	return c.clients[clusterIndex(c.names, key)]
}

// NameFor is the name of the cluster key goes to.
func (c *Clusters) NameFor(key string) string {
	return c.names[clusterIndex(c.names, key)]
}

// Names are the clusters' names, in byte order.
func (c *Clusters) Names() []string {
	return append([]string(nil), c.names...)
}

// Client is the client of the cluster called name, or nil if there is none:
// for what concerns a cluster rather than a key (its Stats while draining
// it).
func (c *Clusters) Client(name string) *Client {
	i := sort.SearchStrings(c.names, name)
	if i < len(c.names) && c.names[i] == name {
		return c.clients[i]
	}
	return nil
}

// Acquire is Client.Acquire on the key's cluster.
func (c *Clusters) Acquire(ctx context.Context, key string, lease, wait time.Duration) (*Lock, error) {
	return c.ClientFor(key).Acquire(ctx, key, lease, wait)
}

// TryAcquire is Client.TryAcquire on the key's cluster.
func (c *Clusters) TryAcquire(ctx context.Context, key string, lease time.Duration) (*Lock, error) {
	return c.ClientFor(key).TryAcquire(ctx, key, lease)
}

// Inspect is Client.Inspect on the key's cluster.
func (c *Clusters) Inspect(ctx context.Context, key string) (KeyState, error) {
	return c.ClientFor(key).Inspect(ctx, key)
}

// LockFrom is Client.LockFrom with the key's cluster's client: a Lock for a
// grant taken elsewhere, from its key and token.
func (c *Clusters) LockFrom(key string, token uint64, lease time.Duration) (*Lock, error) {
	return c.ClientFor(key).LockFrom(key, token, lease)
}

// Close closes every cluster's client; the first error, if any.
func (c *Clusters) Close() error {
	var first error
	for _, client := range c.clients {
		if err := client.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
