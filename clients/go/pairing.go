package ringlock

// Pairing replies with the requests in flight on one connection.
//
// Replies may come back in any order, but each echoes its request's
// operation and key, and replies for the same (op, key) on one connection
// come back in the order the requests were sent (docs/protocol.md §3). So a reply
// takes the oldest request in flight with its (op, key): a connection keeps
// its requests in flight in send order, and, while it has many, a FIFO of
// requests for each (op, key) as well.

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

// indexFrom is how many requests in flight make a pairing index them by
// (op, key). Below it a reply is paired by scanning the requests in send
// order, which, as the server answers most requests in the order it reads
// them, usually stops at the first: cheaper than the map's lookups, which
// were about a tenth of the client's work with 64 goroutines. Above it
// (many acquires waiting on held keys), the map bounds the work per reply.
const indexFrom = 64

// fifo is the requests of one (op, key), oldest first, linked through
// operation.next so that a push allocates nothing beyond the map's slot.
type fifo struct {
	head, tail *operation
}

// pairing is the requests in flight on one connection. It is not safe for
// concurrent use; the connection's lock guards it.
type pairing struct {
	// oldest and newest end the list of every request in flight in send
	// order, linked through operation.older and operation.newer.
	oldest, newest *operation
	// byOp indexes the requests by (op, key) while indexed.
	byOp    [6]map[string]fifo
	indexed bool
	count   int
}

// len is the number of requests in flight.
func (p *pairing) len() int {
	return p.count
}

// push records o as sent after every request already in the table.
func (p *pairing) push(o *operation) {
	o.older, o.newer = p.newest, nil
	if p.newest == nil {
		p.oldest = o
	} else {
		p.newest.newer = o
	}
	p.newest = o
	p.count++
	if p.indexed {
		p.index(o)
	} else if p.count > indexFrom {
		p.indexed = true
		for each := p.oldest; each != nil; each = each.newer {
			p.index(each)
		}
	}
}

// index adds o, the newest request of its (op, key), to byOp.
func (p *pairing) index(o *operation) {
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
}

// take removes and returns the oldest request with this (op, key), which
// the reply answers; nil if there is none (a reply nobody asked for).
func (p *pairing) take(op byte, key []byte) *operation {
	index := opIndex(op)
	if index < 0 {
		return nil
	}
	var o *operation
	if p.indexed {
		table := p.byOp[index]
		// string(key) in a map index does not allocate.
		queue, ok := table[string(key)]
		if !ok {
			return nil
		}
		o = queue.head
		// The stored keys are strings already: using them spares the copy
		// a string(key) would make to write the map.
		if o.next == nil {
			delete(table, o.key)
		} else {
			queue.head = o.next
			table[o.next.key] = queue
		}
		o.next = nil
	} else {
		// The first match in send order is the oldest of its (op, key).
		for o = p.oldest; o != nil; o = o.newer {
			if o.key == string(key) && o.op() == op {
				break
			}
		}
		if o == nil {
			return nil
		}
	}
	if o.older == nil {
		p.oldest = o.newer
	} else {
		o.older.newer = o.newer
	}
	if o.newer == nil {
		p.newest = o.older
	} else {
		o.newer.older = o.older
	}
	o.older, o.newer = nil, nil
	p.count--
	if p.count == 0 {
		// The maps are empty: pair by scanning again.
		p.indexed = false
	}
	return o
}

// drain removes and returns every request in flight, in the order sent.
func (p *pairing) drain() []*operation {
	operations := make([]*operation, 0, p.count)
	for o := p.oldest; o != nil; {
		newer := o.newer
		o.older, o.newer, o.next = nil, nil, nil
		operations = append(operations, o)
		o = newer
	}
	for index := range p.byOp {
		p.byOp[index] = nil
	}
	*p = pairing{}
	return operations
}
