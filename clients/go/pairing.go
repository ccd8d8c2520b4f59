package ringlock

// Pairing replies with the requests in flight on one connection.
//
// Replies may come back in any order, but each echoes its request's
// operation and key, and replies for the same (op, key) on one connection
// come back in the order the requests were sent (SPEC §3). So a connection
// keeps, for each (op, key) in flight, a FIFO of requests, and a reply
// takes the oldest request of its (op, key).

// opIndex maps an operation letter to its table in a pairing.
func opIndex(op byte) int {
	switch op {
	case opAcquire:
		return 0
	case opRelease:
		return 1
	case opExtend:
		return 2
	case opPing:
		return 3
	case opStats:
		return 4
	case opInspect:
		return 5
	}
	return -1
}

// fifo is the requests of one (op, key), oldest first, linked through
// operation.next so that a push allocates nothing beyond the map's slot.
type fifo struct {
	head, tail *operation
}

// pairing is the requests in flight on one connection. It is not safe for
// concurrent use; the connection's lock guards it.
type pairing struct {
	byOp  [6]map[string]fifo
	count int
}

// len is the number of requests in flight.
func (p *pairing) len() int {
	return p.count
}

// push records o as sent after every request already in the table.
func (p *pairing) push(o *operation) {
	index := opIndex(o.op())
	table := p.byOp[index]
	if table == nil {
		table = make(map[string]fifo)
		p.byOp[index] = table
	}
	o.next = nil
	queue := table[o.key]
	if queue.tail == nil {
		queue.head = o
	} else {
		queue.tail.next = o
	}
	queue.tail = o
	table[o.key] = queue
	p.count++
}

// take removes and returns the oldest request with this (op, key), which
// the reply answers; nil if there is none (a reply nobody asked for).
func (p *pairing) take(op byte, key []byte) *operation {
	index := opIndex(op)
	if index < 0 {
		return nil
	}
	table := p.byOp[index]
	// string(key) in a map index does not allocate.
	queue, ok := table[string(key)]
	if !ok {
		return nil
	}
	o := queue.head
	// The stored keys are strings already: using them spares the copy a
	// string(key) would make to write the map.
	if o.next == nil {
		delete(table, o.key)
	} else {
		queue.head = o.next
		table[o.next.key] = queue
	}
	o.next = nil
	p.count--
	return o
}

// drain removes and returns every request in flight, each (op, key) in the
// order sent.
func (p *pairing) drain() []*operation {
	operations := make([]*operation, 0, p.count)
	for index, table := range p.byOp {
		for _, queue := range table {
			for o := queue.head; o != nil; {
				next := o.next
				o.next = nil
				operations = append(operations, o)
				o = next
			}
		}
		p.byOp[index] = nil
	}
	p.count = 0
	return operations
}
