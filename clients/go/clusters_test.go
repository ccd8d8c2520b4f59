package ringlock_test

// Several clusters (docs/protocol.md §4, "Several clusters"): the choice
// against clients/cluster-hash-vectors.json, and Clusters against two real
// single-node servers: each key goes to the server its score names, and a
// drained cluster leaves the list with its keys going to the others.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

func TestClusterForMatchesEveryVectorOfTheReference(t *testing.T) {
	text, err := os.ReadFile("../cluster-hash-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Clusters  []string `json:"clusters"`
			KeyHex    string   `json:"key_hex"`
			ScoresHex []string `json:"scores_hex"`
			Chosen    string   `json:"chosen"`
		} `json:"vectors"`
	}
	if err := json.Unmarshal(text, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Vectors) != 28 {
		t.Fatalf("%d vectors, expected four sets of names by seven keys", len(file.Vectors))
	}
	for _, vector := range file.Vectors {
		key, err := hex.DecodeString(vector.KeyHex)
		if err != nil {
			t.Fatal(err)
		}
		for i, name := range vector.Clusters {
			want, err := strconv.ParseUint(vector.ScoresHex[i], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			if got := ringlock.ClusterScore(name, string(key)); got != want {
				t.Errorf("score(%s, %x) = %016x, want %016x", name, key, got, want)
			}
		}
		if got := ringlock.ClusterFor(vector.Clusters, string(key)); got != vector.Chosen {
			t.Errorf("ClusterFor(%v, %x) = %s, want %s", vector.Clusters, key, got, vector.Chosen)
		}
		reversed := slices.Clone(vector.Clusters)
		slices.Reverse(reversed)
		if got := ringlock.ClusterFor(reversed, string(key)); got != vector.Chosen {
			t.Errorf("ClusterFor(%v, %x) = %s, want %s: the order must not matter", reversed, key, got, vector.Chosen)
		}
	}
	if got := ringlock.ClusterFor(nil, "k"); got != "" {
		t.Errorf("ClusterFor(nil) = %q", got)
	}
}

func TestNewClustersRefusesNoneAnEmptyNameAndANilClient(t *testing.T) {
	client := dialClient(t, addr)
	for _, clusters := range []map[string]*ringlock.Client{
		{},
		{"": client},
		{"a": client, "b": nil},
		{"a\xff": client},
	} {
		if _, err := ringlock.NewClusters(clusters); !errors.Is(err, ringlock.ErrBadArgument) {
			t.Errorf("NewClusters(%v) = %v, want ErrBadArgument", clusters, err)
		}
	}
}

// dialClient dials addrs, closed when the test ends.
func dialClient(t *testing.T, addrs ...string) *ringlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	client, err := ringlock.Dial(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// holder is the token holding key on the server of conn, 0 if none.
func holder(t *testing.T, conn *rawConnection, key string) uint64 {
	t.Helper()
	fields := strings.Fields(conn.call(t, "I "+key))
	if len(fields) < 3 || fields[0] != "I" {
		t.Fatalf("not an I reply: %v", fields)
	}
	token, err := strconv.ParseUint(fields[2], 10, 64)
	if err != nil {
		return 0
	}
	return token
}

func clusterKeys() []string {
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("orders/%d", i)
	}
	return keys
}

func TestClustersSendEachKeyToTheClusterItsScoreNames(t *testing.T) {
	a, b := newServer(t), newServer(t)
	clusters, err := ringlock.NewClusters(map[string]*ringlock.Client{"a": dialClient(t, a.addr), "b": dialClient(t, b.addr)})
	if err != nil {
		t.Fatal(err)
	}
	rawA, rawB := newRawConnection(t, a.addr), newRawConnection(t, b.addr)
	ctx := context.Background()
	for _, key := range clusterKeys() {
		chosen := ringlock.ClusterFor([]string{"a", "b"}, key)
		if got := clusters.NameFor(key); got != chosen {
			t.Fatalf("NameFor(%s) = %s, ClusterFor says %s", key, got, chosen)
		}
		lock, err := clusters.Acquire(ctx, key, time.Minute, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		there, elsewhere := rawA, rawB
		if chosen == "b" {
			there, elsewhere = rawB, rawA
		}
		if got := holder(t, there, key); got != lock.Token() {
			t.Fatalf("%s on %s is held by %d, not %d", key, chosen, got, lock.Token())
		}
		if got := holder(t, elsewhere, key); got != 0 {
			t.Fatalf("%s is held on the other cluster too (%d)", key, got)
		}
		if state, err := clusters.Inspect(ctx, key); err != nil || state.Token != lock.Token() {
			t.Fatalf("Inspect(%s) = %+v, %v", key, state, err)
		}
		if _, err := clusters.TryAcquire(ctx, key, time.Minute); !errors.Is(err, ringlock.ErrTimeout) {
			t.Fatalf("TryAcquire of a held key: %v", err)
		}
		rebuilt, err := clusters.LockFrom(key, lock.Token(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if err := rebuilt.Release(ctx); err != nil {
			t.Fatalf("release through the key's cluster: %v", err)
		}
		if got := holder(t, there, key); got != 0 {
			t.Fatalf("%s still held after its release", key)
		}
	}
	if a.stat(t, "grants") == 0 || b.stat(t, "grants") == 0 {
		t.Fatal("both clusters serve some of 40 keys")
	}
}

// docs/protocol.md §4: drain a cluster before taking it out of the list.
func TestADrainedClusterLeavesTheListAndItsKeysGoToTheOthers(t *testing.T) {
	a, b := newServer(t), newServer(t)
	clientA := dialClient(t, a.addr)
	both, err := ringlock.NewClusters(map[string]*ringlock.Client{"a": clientA, "b": dialClient(t, b.addr)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var onA, onB []*ringlock.Lock
	for _, key := range clusterKeys() {
		lock, err := both.Acquire(ctx, key, time.Minute, ringlock.NoLimit)
		if err != nil {
			t.Fatal(err)
		}
		if both.NameFor(key) == "a" {
			onA = append(onA, lock)
		} else {
			onB = append(onB, lock)
		}
	}
	if len(onA) == 0 || len(onB) == 0 {
		t.Fatal("both clusters hold some keys")
	}
	// Drain b: its holders release until its S shows no held keys.
	for _, lock := range onB {
		if err := lock.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "b shows no held keys", func() bool { return b.stat(t, "held_keys") == 0 })
	onlyA, err := ringlock.NewClusters(map[string]*ringlock.Client{"a": clientA})
	if err != nil {
		t.Fatal(err)
	}
	rawA := newRawConnection(t, a.addr)
	for _, lock := range onB {
		key := lock.Key()
		moved, err := onlyA.TryAcquire(ctx, key, time.Minute)
		if err != nil {
			t.Fatalf("%s, drained from b, is not free on a: %v", key, err)
		}
		if got := holder(t, rawA, key); got != moved.Token() {
			t.Fatalf("%s is held on a by %d, not %d", key, got, moved.Token())
		}
	}
	for _, lock := range onA {
		if _, err := onlyA.TryAcquire(ctx, lock.Key(), time.Minute); !errors.Is(err, ringlock.ErrTimeout) {
			t.Fatalf("%s stays held by its holder on a: %v", lock.Key(), err)
		}
	}
	if got, want := a.stat(t, "held_keys"), uint64(len(onA)+len(onB)); got != want {
		t.Fatalf("a holds %d keys, want %d", got, want)
	}
	if got := b.stat(t, "held_keys"); got != 0 {
		t.Fatalf("b holds %d keys after the drain", got)
	}
	if !slices.Equal(onlyA.Names(), []string{"a"}) || onlyA.Client("b") != nil || onlyA.Client("a") != clientA {
		t.Fatal("Names and Client name the clusters given")
	}
}
