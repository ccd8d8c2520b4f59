package ringlock

// The wire protocol v1 as the client needs it: request lines out, reply
// lines in (docs/protocol.md §3). Nothing here does I/O.

import (
	"bytes"
	"errors"
	"math"
	"strconv"
	"time"
)

// Limits of the protocol, shared with the server.
const (
	// KeyLenMax is the longest key, in bytes.
	KeyLenMax = 250
	// WaitMax is the longest bounded wait an acquire may ask for.
	WaitMax = 86400 * time.Second
	// replyLineLenMax is the longest reply line the client reads (an S
	// reply stays under 64 KiB); a longer one is a protocol violation.
	replyLineLenMax = 65536
	// nodesMax is the most nodes a cluster may have, so the most a client
	// talks to, learned ones included.
	nodesMax = 16
)

// Operation letters, as requests and replies name them.
const (
	opAcquire byte = 'A'
	opRelease byte = 'R'
	opExtend  byte = 'X'
	opPing    byte = 'P'
	opStats   byte = 'S'
	opInspect byte = 'I'
)

// opName is the operation's letter as text, for errors.
func opName(op byte) string {
	switch op {
	case opAcquire, opRelease, opExtend, opPing, opStats, opInspect:
		return string(op)
	}
	return "-"
}

// checkKey reports why key cannot be sent, or nil. The key "-" is legal on
// the wire, but an E reply writes "-" for "no valid key", so an error about
// it could not be paired with its request.
func checkKey(key string) error {
	if len(key) == 0 || len(key) > KeyLenMax {
		return &ArgumentError{Arg: "key", Reason: "a key is 1 to 250 bytes"}
	}
	if key == "-" {
		return &ArgumentError{Arg: "key", Reason: `the key "-" is reserved: error replies use it for "no key"`}
	}
	for i := 0; i < len(key); i++ {
		if forbiddenKeyBytes[key[i]] {
			return &ArgumentError{Arg: "key", Reason: "a key holds no space, tab, CR, LF or NUL"}
		}
	}
	return nil
}

// forbiddenKeyBytes marks the bytes a key may not hold; a table lookup per
// byte is cheaper than five comparisons, on every acquire.
var forbiddenKeyBytes = [256]bool{' ': true, '\t': true, '\r': true, '\n': true, 0: true}

// millisecondsUp is d rounded up to the millisecond, as the server works
// in milliseconds and a lease must never come out shorter than asked.
func millisecondsUp(d time.Duration) uint64 {
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

// appendSeconds writes ms as decimal seconds with at most 3 fractional
// digits and no trailing zeros ("30", "0.5", "2.125").
func appendSeconds(out []byte, ms uint64) []byte {
	out = strconv.AppendUint(out, ms/1000, 10)
	fraction := ms % 1000
	if fraction == 0 {
		return out
	}
	digits := [4]byte{'.', byte('0' + fraction/100), byte('0' + fraction/10%10), byte('0' + fraction%10)}
	end := 4
	for digits[end-1] == '0' {
		end--
	}
	return append(out, digits[:end]...)
}

// reply is one decoded reply line. Its byte slices point into the read
// buffer and are valid only until the next read.
type reply struct {
	// kind is the reply's first letter: A T R X M E P S I.
	kind byte
	// op is the operation the reply answers (0 for "E - -").
	op byte
	// key is the key echoed; nil for P, S and "-".
	key []byte
	// token is the fencing token of A and X, and of I's holder.
	token uint64
	// held is set for an I reply naming a holder (a token, not "-").
	held bool
	// leaseLeftMs is I's lease left, in milliseconds.
	leaseLeftMs uint64
	// waiters is I's count of queued acquires.
	waiters uint64
	// code is the error code of E.
	code Code
	// address is the active node of M and P; nil for "-".
	address []byte
	// role is P's role.
	role Role
	// epoch is P's epoch.
	epoch uint64
	// json is S's body.
	json []byte
}

var errMalformedReply = errors.New("malformed reply")

// parseReply reads one reply line without its line ending.
func parseReply(line []byte) (reply, error) {
	var r reply
	err := parseReplyInto(line, &r)
	return r, err
}

// parseReplyInto is parseReply into r, which the reader reuses: a reply is
// large enough that returning it costs a measurable copy per line.
func parseReplyInto(line []byte, r *reply) error {
	*r = reply{}
	if parseGrantOrRelease(line, r) {
		return nil
	}
	*r = reply{}
	return parseReplyFields(line, r)
}

// parseReplyFields parses any reply by splitting it into its fields.
func parseReplyFields(line []byte, r *reply) error {
	if len(line) < 1 {
		return errMalformedReply
	}
	r.kind = line[0]
	if r.kind == 'S' {
		// The rest of the line is one JSON object, not parsed here.
		if len(line) < 3 || line[1] != ' ' {
			return errMalformedReply
		}
		r.op = opStats
		r.json = line[2:]
		return nil
	}
	var fieldsBuffer [6][]byte
	fields, ok := splitFields(line, fieldsBuffer[:0])
	if !ok {
		return errMalformedReply
	}
	if err := parseFields(fields, r); err != nil {
		*r = reply{}
		return errMalformedReply
	}
	return nil
}

// splitFields splits a reply line at its spaces into fields (at most
// len(buffer)-1 of them, into buffer); false if there are more, if the first
// is not one letter, or if a later one is empty.
func splitFields(line []byte, fields [][]byte) ([][]byte, bool) {
	for rest := line; ; {
		at := bytes.IndexByte(rest, ' ')
		if at < 0 {
			fields = append(fields, rest)
			break
		}
		if len(fields) == cap(fields)-1 {
			return nil, false
		}
		fields = append(fields, rest[:at])
		rest = rest[at+1:]
	}
	if len(fields[0]) != 1 {
		return nil, false
	}
	for _, field := range fields[1:] {
		if len(field) == 0 {
			return nil, false
		}
	}
	return fields, true
}

// parseFields fills r from the fields of a reply of kind r.kind.
func parseFields(fields [][]byte, r *reply) error {
	var err error
	switch {
	case r.kind == 'A' && len(fields) == 3, r.kind == 'X' && len(fields) == 3:
		r.op = r.kind
		r.key, err = keyField(fields[1])
		if err == nil {
			r.token, err = parseUint64(fields[2])
		}
	case r.kind == 'T' && len(fields) == 2:
		r.op = opAcquire
		r.key, err = keyField(fields[1])
	case r.kind == 'R' && len(fields) == 2:
		r.op = opRelease
		r.key, err = keyField(fields[1])
	case r.kind == 'M' && len(fields) == 4:
		err = parseMoved(fields, r)
	case r.kind == 'E' && len(fields) == 4:
		if string(fields[1]) != "-" {
			r.op, err = opField(fields[1])
		}
		if err == nil && string(fields[2]) != "-" {
			r.key, err = keyField(fields[2])
		}
		r.code = Code(fields[3])
	case r.kind == 'I' && len(fields) == 5:
		err = parseInspect(fields, r)
	case r.kind == 'P' && len(fields) == 4:
		err = parsePing(fields, r)
	default:
		err = errMalformedReply
	}
	return err
}

// parseMoved parses "M <op> <key> <active|->".
func parseMoved(fields [][]byte, r *reply) error {
	var err error
	r.op, err = opField(fields[1])
	if err == nil && (r.op == opPing || r.op == opStats) {
		err = errMalformedReply
	}
	if err == nil {
		r.key, err = keyField(fields[2])
	}
	if err == nil && string(fields[3]) != "-" {
		r.address = fields[3]
	}
	return err
}

// parseInspect parses "I <key> <token|-> <lease-left-ms> <waiters>".
func parseInspect(fields [][]byte, r *reply) error {
	r.op = opInspect
	key, err := keyField(fields[1])
	r.key = key
	if err == nil && string(fields[2]) != "-" {
		r.token, err = parseUint64(fields[2])
		r.held = err == nil
	}
	if err == nil {
		r.leaseLeftMs, err = parseUint64(fields[3])
	}
	if err == nil {
		r.waiters, err = parseUint64(fields[4])
	}
	return err
}

// parsePing parses "P <role> <epoch> <active|->".
func parsePing(fields [][]byte, r *reply) error {
	r.op = opPing
	r.role = Role(fields[1])
	if r.role != RoleActive && r.role != RoleStandby {
		return errMalformedReply
	}
	var err error
	r.epoch, err = parseUint64(fields[2])
	if err == nil && string(fields[3]) != "-" {
		r.address = fields[3]
	}
	return err
}

// parseGrantOrRelease parses the two replies nearly every line is, "A
// <key> <token>" and "R <key>", in one pass over the line (the general path
// looks at each byte several times); false for any other line, which the
// general path then parses or rejects.
func parseGrantOrRelease(line []byte, r *reply) bool {
	if len(line) < 3 || line[1] != ' ' || (line[0] != 'A' && line[0] != 'R') {
		return false
	}
	rest := line[2:]
	end := 0
	for end < len(rest) && rest[end] != ' ' {
		if forbiddenReplyKeyBytes[rest[end]] {
			return false
		}
		end++
	}
	if end == 0 || end > KeyLenMax {
		return false
	}
	r.kind, r.key = line[0], rest[:end]
	if r.kind == 'R' {
		r.op = opRelease
		return end == len(rest)
	}
	if end == len(rest) {
		return false
	}
	token, err := parseUint64(rest[end+1:])
	r.op, r.token = opAcquire, token
	return err == nil
}

// forbiddenReplyKeyBytes marks the bytes keyField refuses in a key (a space
// ends it).
var forbiddenReplyKeyBytes = [256]bool{0: true, '\t': true, '\r': true}

func keyField(field []byte) ([]byte, error) {
	if len(field) > KeyLenMax || bytes.IndexByte(field, 0) >= 0 || bytes.IndexByte(field, '\t') >= 0 ||
		bytes.IndexByte(field, '\r') >= 0 {
		return nil, errMalformedReply
	}
	return field, nil
}

func opField(field []byte) (byte, error) {
	if len(field) == 1 && opName(field[0]) != "-" {
		return field[0], nil
	}
	return 0, errMalformedReply
}

// parseUint64 reads a decimal u64: ASCII digits only, no sign. It works on
// the bytes in place, as strconv would need a string copy of each token.
func parseUint64(field []byte) (uint64, error) {
	if len(field) == 0 || len(field) > 20 {
		return 0, errMalformedReply
	}
	var n uint64
	for _, b := range field {
		if b < '0' || b > '9' {
			return 0, errMalformedReply
		}
		digit := uint64(b - '0')
		if n > (math.MaxUint64-digit)/10 {
			return 0, errMalformedReply
		}
		n = n*10 + digit
	}
	return n, nil
}

// appendAuth appends "U <secret>", the first line of every connection of a
// client with a secret.
func appendAuth(buffer []byte, secret string) []byte {
	buffer = append(buffer, "U "...)
	buffer = append(buffer, secret...)
	return append(buffer, '\n')
}

// parseAuthAnswer reads the answer to U (line without its line ending): the
// name the connection is authenticated as; else the code of an "E U - code"
// (CodeAuthFailed, CodeAuthDisabled) or of an "E - - code" refusing the
// connection, with an empty name; else a *ProtocolError.
func parseAuthAnswer(line []byte) (name string, code Code, err error) {
	fields := bytes.Split(line, []byte{' '})
	switch {
	case len(fields) == 2 && string(fields[0]) == "U" && len(fields[1]) > 0:
		return string(fields[1]), "", nil
	case len(fields) == 4 && string(fields[0]) == "E" && string(fields[2]) == "-" &&
		(string(fields[1]) == "U" || string(fields[1]) == "-") && len(fields[3]) > 0:
		return "", Code(fields[3]), nil
	}
	return "", "", protocolError("an unexpected answer to U", line)
}
