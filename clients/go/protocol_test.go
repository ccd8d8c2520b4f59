package ringlock

import (
	"errors"
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
