package ringlock

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestAppendSecondsWritesAtMostThreeFractionalDigits(t *testing.T) {
	for ms, want := range map[uint64]string{
		0: "0", 1: "0.001", 10: "0.01", 500: "0.5", 1000: "1", 1500: "1.5", 2125: "2.125", 30000: "30",
		86400000: "86400",
	} {
		if got := string(appendSeconds(nil, ms)); got != want {
			t.Errorf("%d ms: %q, want %q", ms, got, want)
		}
	}
}

func TestMillisecondsRoundUp(t *testing.T) {
	for d, want := range map[time.Duration]uint64{
		time.Nanosecond: 1, time.Millisecond: 1, time.Millisecond + 1: 2, 1500 * time.Microsecond: 2, time.Second: 1000,
	} {
		if got := millisecondsUp(d); got != want {
			t.Errorf("%v: %d ms, want %d", d, got, want)
		}
	}
}

func TestCheckKey(t *testing.T) {
	for _, key := range []string{"k", "orders/42", strings.Repeat("k", KeyLenMax), "é", "--"} {
		if err := checkKey(key); err != nil {
			t.Errorf("%q refused: %v", key, err)
		}
	}
	for _, key := range []string{"", "-", "two words", "tab\there", "cr\r", "lf\n", "nul\x00", strings.Repeat("k", KeyLenMax+1)} {
		var argument *ArgumentError
		if err := checkKey(key); !errors.As(err, &argument) || argument.Arg != "key" {
			t.Errorf("%q: %v, want a key ArgumentError", key, err)
		}
	}
}

func TestParseReplyReadsEveryKind(t *testing.T) {
	r, err := parseReply([]byte("A orders/42 17592186044416"))
	if err != nil || r.kind != 'A' || r.op != opAcquire || string(r.key) != "orders/42" || r.token != 17592186044416 {
		t.Fatalf("A: %+v %v", r, err)
	}
	r, err = parseReply([]byte("T k"))
	if err != nil || r.op != opAcquire || string(r.key) != "k" {
		t.Fatalf("T: %+v %v", r, err)
	}
	r, err = parseReply([]byte("R k"))
	if err != nil || r.op != opRelease || string(r.key) != "k" {
		t.Fatalf("R: %+v %v", r, err)
	}
	r, err = parseReply([]byte("X k 18446744073709551615"))
	if err != nil || r.op != opExtend || r.token != 18446744073709551615 {
		t.Fatalf("X: %+v %v", r, err)
	}
	r, err = parseReply([]byte("M A k 10.0.0.2:7700"))
	if err != nil || r.kind != 'M' || r.op != opAcquire || string(r.address) != "10.0.0.2:7700" {
		t.Fatalf("M: %+v %v", r, err)
	}
	r, err = parseReply([]byte("M R k -"))
	if err != nil || r.op != opRelease || r.address != nil {
		t.Fatalf("M -: %+v %v", r, err)
	}
	r, err = parseReply([]byte("E R k not-holder"))
	if err != nil || r.op != opRelease || string(r.key) != "k" || r.code != CodeNotHolder {
		t.Fatalf("E: %+v %v", r, err)
	}
	r, err = parseReply([]byte("E - - line-too-long"))
	if err != nil || r.op != 0 || r.key != nil || r.code != CodeLineTooLong {
		t.Fatalf("E - -: %+v %v", r, err)
	}
	r, err = parseReply([]byte("E A - bad-key"))
	if err != nil || r.op != opAcquire || r.key != nil {
		t.Fatalf("E A -: %+v %v", r, err)
	}
	r, err = parseReply([]byte("P standby 0 -"))
	if err != nil || r.op != opPing || r.role != RoleStandby || r.epoch != 0 || r.address != nil {
		t.Fatalf("P: %+v %v", r, err)
	}
	r, err = parseReply([]byte(`S {"role":"active"}`))
	if err != nil || r.op != opStats || string(r.json) != `{"role":"active"}` {
		t.Fatalf("S: %+v %v", r, err)
	}
}

func TestParseReplyReadsInspect(t *testing.T) {
	r, err := parseReply([]byte("I orders/42 17592186044416 1500 3"))
	if err != nil || r.kind != 'I' || r.op != opInspect || string(r.key) != "orders/42" || !r.held ||
		r.token != 17592186044416 || r.leaseLeftMs != 1500 || r.waiters != 3 {
		t.Fatalf("held: %+v %v", r, err)
	}
	r, err = parseReply([]byte("I k - 0 0"))
	if err != nil || r.op != opInspect || string(r.key) != "k" || r.held || r.token != 0 || r.leaseLeftMs != 0 ||
		r.waiters != 0 {
		t.Fatalf("free: %+v %v", r, err)
	}
	// A free key with acquires waiting for the server to grant tokens.
	r, err = parseReply([]byte("I k - 0 2"))
	if err != nil || r.held || r.waiters != 2 {
		t.Fatalf("free with waiters: %+v %v", r, err)
	}
	// A lease that runs out as the server answers; the largest numbers.
	r, err = parseReply([]byte("I k 18446744073709551615 0 18446744073709551615"))
	if err != nil || !r.held || r.token != 18446744073709551615 || r.leaseLeftMs != 0 || r.waiters != 18446744073709551615 {
		t.Fatalf("extremes: %+v %v", r, err)
	}
	r, err = parseReply([]byte("M I k 10.0.0.2:7700"))
	if err != nil || r.kind != 'M' || r.op != opInspect || string(r.key) != "k" || string(r.address) != "10.0.0.2:7700" {
		t.Fatalf("M I: %+v %v", r, err)
	}
	r, err = parseReply([]byte("M I k -"))
	if err != nil || r.op != opInspect || r.address != nil {
		t.Fatalf("M I -: %+v %v", r, err)
	}
	r, err = parseReply([]byte("E I k bad-request"))
	if err != nil || r.kind != 'E' || r.op != opInspect || string(r.key) != "k" || r.code != CodeBadRequest {
		t.Fatalf("E I: %+v %v", r, err)
	}
	r, err = parseReply([]byte("E I - bad-key"))
	if err != nil || r.op != opInspect || r.key != nil || r.code != CodeBadKey {
		t.Fatalf("E I -: %+v %v", r, err)
	}
}

func TestParseReplyRefusesMalformedInspects(t *testing.T) {
	for _, line := range []string{
		"I", "I k", "I k -", "I k - 0", "I k - 0 0 0", "I k 5 10 1 extra", "I k x 0 0", "I k -1 0 0", "I k +1 0 0",
		"I k 1 -5 0", "I k 1 1.5 0", "I k 1 0 -", "I k - - 0", "I k 18446744073709551616 0 0",
		"I k 1 0 18446744073709551616", "I  - 0 0", "I k - 0 0 ", "I k\t - 0 0", "II k - 0 0",
	} {
		if r, err := parseReply([]byte(line)); err == nil {
			t.Errorf("%q read as %+v", line, r)
		}
	}
}

func TestParseReplyRefusesMalformedLines(t *testing.T) {
	for _, line := range []string{
		"", "A", "A k", "A k 1 2", "A k -1", "A k +1", "A k 18446744073709551616", "A k 1x", "A  k 1", "A k 1 ",
		"T", "T k extra", "R", "X k", "M A k", "M Q k a", "M P k a", "E A k", "P leader 1 a", "P active x a",
		"S", "S ", "Z k", "AA k 1", "A k\t 1",
	} {
		if r, err := parseReply([]byte(line)); err == nil {
			t.Errorf("%q read as %+v", line, r)
		}
	}
}

// The one-pass path for A and R replies reads what the general path reads,
// and leaves every other line to it: checked on well-formed lines and on
// random mutations of them.
func TestTheGrantAndReleasePathAgreesWithTheGeneralOne(t *testing.T) {
	lines := []string{"A k 1", "R k", "A orders/42 17592186044416", "R orders/42", "A k 18446744073709551615",
		"A k 18446744073709551616", "A k", "R k 5", "A  k 5", "A k  5", "A k 5 ", "R k ", "R ", "A", "T k",
		"X k 5", "E R k not-holder", "M A k 10.0.0.2:7700", "P active 1 -", "A k\t1 5", "A k\r 5", "R \x00",
		"A 0" + strings.Repeat("k", KeyLenMax-1) + " 7", "A 0" + strings.Repeat("k", KeyLenMax) + " 7",
		"R " + strings.Repeat("k", KeyLenMax), "R " + strings.Repeat("k", KeyLenMax+1), "A k 007",
		"A k 123456789012345678901"}
	random := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("AR k0123456789 \t\r\x00x")
	for range 20000 {
		line := []byte(lines[random.IntN(len(lines))])
		for range random.IntN(4) {
			switch at := random.IntN(len(line) + 1); random.IntN(3) {
			case 0:
				line = append(line[:at:at], append([]byte{alphabet[random.IntN(len(alphabet))]}, line[at:]...)...)
			case 1:
				if at < len(line) {
					line = append(line[:at:at], line[at+1:]...)
				}
			default:
				if at < len(line) {
					line[at] = alphabet[random.IntN(len(alphabet))]
				}
			}
		}
		lines = append(lines, string(line))
	}
	fast := 0
	var reused reply
	for _, line := range lines {
		var quick, general reply
		generalErr := parseReplyFields([]byte(line), &general)
		// What the reader gets, through a reply reused from the last line.
		if err := parseReplyInto([]byte(line), &reused); (err == nil) != (generalErr == nil) ||
			(err == nil && !reflect.DeepEqual(reused, general)) {
			t.Fatalf("%q: read as %+v (%v), the general parser reads %+v (%v)", line, reused, err, general, generalErr)
		}
		if !parseGrantOrRelease([]byte(line), &quick) {
			continue
		}
		fast++
		if generalErr != nil {
			t.Fatalf("%q: the one-pass path accepts what the general one refuses: %v", line, generalErr)
		}
		if !reflect.DeepEqual(quick, general) {
			t.Fatalf("%q: one-pass %+v, general %+v", line, quick, general)
		}
	}
	if fast < 200 {
		t.Fatalf("only %d of %d lines took the one-pass path", fast, len(lines))
	}
}

func TestTheAnswerToUIsANameOrACode(t *testing.T) {
	if got := string(appendAuth(nil, "s3cret")); got != "U s3cret\n" {
		t.Errorf("appendAuth: %q", got)
	}
	for line, want := range map[string]struct {
		name string
		code Code
	}{
		"U billing":                  {name: "billing"},
		"E U - auth-failed":          {code: CodeAuthFailed},
		"E U - auth-disabled":        {code: CodeAuthDisabled},
		"E - - too-many-connections": {code: CodeTooManyConnections},
	} {
		name, code, err := parseAuthAnswer([]byte(line))
		if err != nil || name != want.name || code != want.code {
			t.Errorf("%q: %q %q %v, want %q %q", line, name, code, err, want.name, want.code)
		}
	}
	for _, line := range []string{"A k 1", "U", "E A k auth-failed", ""} {
		var violation *ProtocolError
		if _, _, err := parseAuthAnswer([]byte(line)); !errors.As(err, &violation) {
			t.Errorf("%q: %v, want a *ProtocolError", line, err)
		}
	}
}
