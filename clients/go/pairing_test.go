package ringlock

import (
	"math/rand"
	"testing"
)

func sent(k kind, key string, serial uint64) *operation {
	// The token field carries a serial number, to tell requests apart.
	return &operation{kind: k, key: key, token: serial}
}

func serialOf(o *operation) int64 {
	if o == nil {
		return -1
	}
	return int64(o.token)
}

func TestSameOpAndKeyPairInSendOrder(t *testing.T) {
	var table pairing
	table.push(sent(kindAcquire, "k", 1))
	table.push(sent(kindRelease, "k", 2))
	table.push(sent(kindAcquire, "k", 3))
	table.push(sent(kindAcquire, "j", 4))
	table.push(sent(kindInspect, "k", 5))
	if table.len() != 5 {
		t.Fatalf("len %d", table.len())
	}
	for _, want := range []struct {
		op     byte
		key    string
		serial int64
	}{
		{opAcquire, "k", 1}, {opAcquire, "j", 4}, {opAcquire, "k", 3}, {opAcquire, "k", -1}, {opExtend, "k", -1},
		{opRelease, "k", 2}, {opInspect, "k", 5}, {opInspect, "k", -1},
	} {
		if got := serialOf(table.take(want.op, []byte(want.key))); got != want.serial {
			t.Fatalf("take %c %s: %d, want %d", want.op, want.key, got, want.serial)
		}
	}
	if table.len() != 0 {
		t.Fatalf("len %d after taking everything", table.len())
	}
	for _, queues := range table.byOp {
		if len(queues) != 0 {
			t.Fatalf("empty queues are dropped: %v", queues)
		}
	}
}

func TestDrainKeepsSendOrderPerOpAndKey(t *testing.T) {
	var table pairing
	for serial := range uint64(10) {
		key := "a"
		if serial%2 == 1 {
			key = "b"
		}
		table.push(sent(kindAcquire, key, serial))
	}
	drained := table.drain()
	if len(drained) != 10 || table.len() != 0 {
		t.Fatalf("drained %d, %d left", len(drained), table.len())
	}
	last := map[string]int64{"a": -1, "b": -1}
	for _, o := range drained {
		if serialOf(o) <= last[o.key] {
			t.Fatalf("%s: %d after %d", o.key, serialOf(o), last[o.key])
		}
		last[o.key] = serialOf(o)
	}
}

// TestPairingAgreesWithAListModel checks the table against a list of
// requests in send order, where a reply takes the first with its (op, key),
// with few requests in flight (paired by scanning) and with more than
// indexFrom (paired through the index), up and down again.
func TestPairingAgreesWithAListModel(t *testing.T) {
	seed := rand.Int63()
	random := rand.New(rand.NewSource(seed))
	kinds := []kind{kindAcquire, kindRelease, kindExtend, kindInspect}
	for run := range 200 {
		var table pairing
		var model []*operation
		// Even runs push as often as they take; odd runs push three times
		// in four for their first half, past indexFrom, then take more.
		steps := uint64(200)
		if run%2 == 1 {
			steps = 8 * indexFrom
		}
		for serial := range steps {
			k := kinds[random.Intn(len(kinds))]
			key := string(rune('a' + random.Intn(4)))
			pushes := 2
			if run%2 == 1 {
				pushes = 3
				if serial >= steps/2 {
					pushes = 1
				}
			}
			if random.Intn(4) < pushes {
				table.push(sent(k, key, serial))
				model = append(model, sent(k, key, serial))
				continue
			}
			probe := &operation{kind: k}
			want := int64(-1)
			for at, o := range model {
				if o.kind == k && o.key == key {
					want = serialOf(o)
					model = append(model[:at], model[at+1:]...)
					break
				}
			}
			if got := serialOf(table.take(probe.op(), []byte(key))); got != want {
				t.Fatalf("seed %d, run %d: take %c %s: %d, want %d", seed, run, probe.op(), key, got, want)
			}
			if table.len() != len(model) {
				t.Fatalf("seed %d, run %d: len %d, want %d", seed, run, table.len(), len(model))
			}
		}
		drained := table.drain()
		if len(drained) != len(model) || table.len() != 0 {
			t.Fatalf("seed %d, run %d: drained %d of %d", seed, run, len(drained), len(model))
		}
		for at, o := range drained {
			if serialOf(o) != serialOf(model[at]) {
				t.Fatalf("seed %d, run %d: drained %d at %d, want %d", seed, run, serialOf(o), at, serialOf(model[at]))
			}
		}
	}
}
