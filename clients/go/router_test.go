package ringlock

// The round-robin turn: it passes a write batch at a time.

import "testing"

func TestTheTurnStaysOnAConnectionGatheringABatchAndMovesOnOnceItIsTaken(t *testing.T) {
	r := &router{}
	connections := []*connection{{address: "a"}, {address: "b"}}
	at := func(position uint64) string { return connections[position%2].address }

	// Nothing gathered: one request at a time goes to each in turn.
	first := at(r.turn(connections))
	second := at(r.turn(connections))
	if first == second {
		t.Fatalf("two requests with nothing gathering both went to %s", first)
	}

	// The connection the last request went to gathers a batch: the
	// requests that follow join it.
	connections[r.next.Load()%2].gathering.Store(true)
	for range 5 {
		if got := at(r.turn(connections)); got != second {
			t.Fatalf("a request went to %s while %s gathered its batch", got, second)
		}
	}

	// Its write took the batch: the next request goes to the other one,
	// and requests then join that one's batch.
	connections[r.next.Load()%2].gathering.Store(false)
	third := at(r.turn(connections))
	if third == second {
		t.Fatalf("the turn stayed on %s after its batch was taken", second)
	}
	connections[r.next.Load()%2].gathering.Store(true)
	if got := at(r.turn(connections)); got != third {
		t.Fatalf("a request went to %s while %s gathered its batch", got, third)
	}
}
