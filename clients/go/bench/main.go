// Command bench measures lock cycles per second (an acquire and its
// release, on distinct keys) through one Go client shared by a number of
// goroutines, for comparison with ringlock-bench on the same server
// (bench.sh beside it runs both).
//
// Usage:
//
//	bench -addr 127.0.0.1:7700 -goroutines 64 -seconds 4 -warmup 1
//
// It prints one line: "<goroutines> goroutines: <cycles/s> cycles/s".
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"ringlock.dev/ringlock"
)

// keysPerGoroutine is the slice of the key space each goroutine cycles
// through, so that no two requests in flight share a key and the server's
// table stays small, as in ringlock-bench's uncontended workload.
const keysPerGoroutine = 4096

func main() {
	addr := flag.String("addr", "127.0.0.1:7700", "server address")
	goroutines := flag.Int("goroutines", 64, "goroutines sharing the client")
	seconds := flag.Float64("seconds", 4, "measured time, in seconds")
	warmup := flag.Float64("warmup", 1, "time run before measuring, in seconds")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the measured time to this file")
	connections := flag.Int("connections", 2, "connections to the server (the client's default for one address is 2)")
	tlsCA := flag.String("tls-ca", "", "speak TLS, trusting the CA of this PEM file (a server with --tls-cert)")
	flag.Parse()

	ctx := context.Background()
	options := []ringlock.Option{ringlock.WithConnectionsPerNode(*connections)}
	if *tlsCA != "" {
		options = append(options, ringlock.WithTLSCA(*tlsCA))
	}
	client, err := ringlock.Dial(ctx, []string{*addr}, options...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	var cycles atomic.Uint64
	var stop atomic.Bool
	var running sync.WaitGroup
	failures := make(chan error, *goroutines)
	for g := range *goroutines {
		// Keys of ringlock-bench's default length: k and 15 digits.
		keys := make([]string, keysPerGoroutine)
		for i := range keys {
			keys[i] = fmt.Sprintf("k%015d", g*keysPerGoroutine+i)
		}
		running.Add(1)
		go func() {
			defer running.Done()
			var done uint64
			for i := 0; !stop.Load(); i++ {
				lock, err := client.Acquire(ctx, keys[i%keysPerGoroutine], 30*time.Second, 10*time.Second)
				if err == nil {
					err = lock.Release(ctx)
				}
				if err != nil {
					failures <- err
					return
				}
				done++
				// Publishing every cycle would make the counter the
				// bottleneck; every 64 is fine-grained enough for seconds.
				if done%64 == 0 {
					cycles.Add(64)
				}
			}
		}()
	}

	time.Sleep(time.Duration(*warmup * float64(time.Second)))
	if *profile != "" {
		out, err := os.Create(*profile)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			log.Fatal(err)
		}
	}
	start, startCycles := time.Now(), cycles.Load()
	time.Sleep(time.Duration(*seconds * float64(time.Second)))
	elapsed, measured := time.Since(start), cycles.Load()-startCycles
	pprof.StopCPUProfile()
	stop.Store(true)
	running.Wait()
	close(failures)
	for err := range failures {
		log.Fatal(err)
	}
	fmt.Printf("%d goroutines: %.0f cycles/s\n", *goroutines, float64(measured)/elapsed.Seconds())
}
