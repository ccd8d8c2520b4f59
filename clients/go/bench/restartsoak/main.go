// Command restartsoak is the Go client's worker for scripts/restart-soak.sh:
// -workers goroutines (default 8) share one client and loop Acquire (lease
// -lease, wait -wait) then Release over -keys keys while the script
// restarts the server under them. It prints "ready" once a first lock cycle
// went through, runs until its standard input ends, and then prints one
// JSON line of what the calls saw (the script reads it and describes the
// fields).
//
// Usage:
//
//	restartsoak -addr 127.0.0.1:7700 -workers 8 -keys 4 -lease 10s -wait 5s < some-fifo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"ringlock.dev/ringlock"
)

// tally is what one worker saw.
type tally struct {
	ok, lostByRestart, notGranted, failed int
	// failures holds [when, call, kind, message] of each failed call.
	failures [][4]any
	// lost holds [acquire asked at, release answered at] of each release
	// answered not-holder: a restart must have stopped the server in
	// between.
	lost       [][2]float64
	lastAnswer float64
	// stall is the longest time between two answered calls: from, to.
	stall [2]float64
}

// now is seconds since the Unix epoch: the script lines these up with its
// restarts.
func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

func (t *tally) answered(at float64) {
	if t.lastAnswer != 0 && at-t.lastAnswer > t.stall[1]-t.stall[0] {
		t.stall = [2]float64{t.lastAnswer, at}
	}
	t.lastAnswer = at
}

func (t *tally) fail(call string, err error) {
	t.failed++
	t.failures = append(t.failures, [4]any{now(), call, kind(err), err.Error()})
}

// kind names the error as the error table of clients/README.md does.
func kind(err error) string {
	var server *ringlock.ServerError
	switch {
	case errors.Is(err, ringlock.ErrNoConnection):
		return "ErrNoConnection"
	case errors.Is(err, ringlock.ErrNoActive):
		return "ErrNoActive"
	case errors.As(err, &server):
		return fmt.Sprintf("ServerError(%s)", server.Code)
	default:
		return fmt.Sprintf("%T", err)
	}
}

func work(client *ringlock.Client, index, keys int, lease, wait time.Duration, stop *atomic.Bool, ready chan<- struct{}) *tally {
	ctx := context.Background()
	t := &tally{}
	for turn := index + 1; !stop.Load(); turn++ {
		askedAt := now()
		lock, err := client.Acquire(ctx, fmt.Sprintf("restart-soak/%d", turn%keys), lease, wait)
		if errors.Is(err, ringlock.ErrTimeout) {
			t.notGranted++
			continue
		}
		if err != nil {
			t.fail("acquire", err)
			// A failure that comes at once must not spin the loop.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		acquiredAt := now()
		t.ok++
		t.answered(acquiredAt)
		err = lock.Release(ctx)
		switch {
		case err == nil:
			t.ok++
			t.answered(now())
			select {
			case ready <- struct{}{}:
			default:
			}
		case errors.Is(err, ringlock.ErrNotHolder):
			at := now()
			t.lostByRestart++
			t.lost = append(t.lost, [2]float64{askedAt, at})
			t.answered(at)
		default:
			t.fail("release", err)
		}
	}
	return t
}

func main() {
	addr := flag.String("addr", "127.0.0.1:7700", "server address")
	workers := flag.Int("workers", 8, "goroutines sharing the client")
	keys := flag.Int("keys", 4, "keys the workers take in turn")
	lease := flag.Duration("lease", 10*time.Second, "lease of each acquire")
	wait := flag.Duration("wait", 5*time.Second, "wait of each acquire")
	flag.Parse()

	client, err := ringlock.Dial(context.Background(), []string{*addr})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	var stop atomic.Bool
	ended := make(chan struct{})
	go func() {
		// Anything until the end of input: the script closes it to stop.
		_, _ = io.Copy(io.Discard, os.Stdin)
		stop.Store(true)
		close(ended)
	}()
	ready := make(chan struct{}, 1)
	tallies := make([]*tally, *workers)
	var running sync.WaitGroup
	for index := range *workers {
		running.Add(1)
		go func() {
			defer running.Done()
			tallies[index] = work(client, index, *keys, *lease, *wait, &stop, ready)
		}()
	}
	select {
	case <-ready:
	case <-ended:
	}
	fmt.Println("ready")
	running.Wait()

	report := map[string]any{"client": "go", "workers": *workers}
	failures, lost := [][4]any{}, [][2]float64{}
	var ok, lostByRestart, notGranted, failed int
	var stall [2]float64
	for _, t := range tallies {
		ok += t.ok
		lostByRestart += t.lostByRestart
		notGranted += t.notGranted
		failed += t.failed
		failures = append(failures, t.failures...)
		lost = append(lost, t.lost...)
		if t.stall[1]-t.stall[0] > stall[1]-stall[0] {
			stall = t.stall
		}
	}
	report["ok"], report["lost_by_restart"], report["not_granted"], report["failed"] = ok, lostByRestart, notGranted, failed
	report["stall_s"], report["stall_from"], report["stall_to"] = stall[1]-stall[0], stall[0], stall[1]
	report["failures"], report["lost"] = failures, lost
	line, err := json.Marshal(report)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(line))
}
