package ringlock_test

// The client scenarios every official client runs (clients/scenarios.json,
// docs/protocol.md §4), each against the real server with its faults made by the test
// kit, driven over its control socket.

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"ringlock.dev/ringlock"
)

const lease = 60 * time.Second

// scenarios maps each id of clients/scenarios.json to its test.
var scenarios = map[string]func(*testing.T){
	"one-address-two-connections":       oneAddressTwoConnections,
	"round-robin":                       roundRobin,
	"cut-node-left-out-and-reconnected": cutNodeLeftOutAndReconnected,
	"pipelined-pairing-out-of-order":    pipelinedPairingOutOfOrder,
	"same-key-in-send-order":            sameKeyInSendOrder,
	"acquire-moves-on-cut":              acquireMovesOnCut,
	"no-connection-left":                noConnectionLeft,
	"restart-within-wait":               restartWithinWait,
	"shutting-down-retried":             shuttingDownRetried,
	"connect-backoff":                   connectBackoff,
	"release-retried":                   releaseRetried,
	"redirect-followed":                 redirectFollowed,
	"redirect-to-no-active":             redirectToNoActive,
	"timeout-is-not-a-grant":            timeoutIsNotAGrant,
	"delayed-replies":                   delayedReplies,
	"silent-connection-suspected":       TestSilentSingleAddressAcquireFailsThenTheClientReconnects,
	"auth-ok":                           authOK,
	"auth-wrong":                        authWrong,
	"auth-forbidden-key":                authForbiddenKey,
	"auth-revoked-on-reload":            authRevokedOnReload,
	"auth-reconnect":                    authReconnect,
	"tls-connect":                       tlsConnect,
	"tls-mtls":                          tlsMTLS,
	"tls-wrong-ca":                      tlsWrongCA,
	"wait-forms":                        waitForms,
	"held-asks-server":                  heldAsksServer,
	"lock-from-key-and-token":           lockFromKeyAndToken,
	"single-node-restart-reports-lost":  singleNodeRestartReportsLost,
	"error-kinds":                       errorKinds,
	"failover-keeps-auto-extended-lock": failoverKeepsAutoExtendedLock,
}

// scenarioIDs reads the ids of clients/scenarios.json.
func scenarioIDs(t *testing.T) []string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "scenarios.json"))
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Scenarios []struct {
			ID string `json:"id"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal(text, &list); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(list.Scenarios))
	for _, scenario := range list.Scenarios {
		ids = append(ids, scenario.ID)
	}
	return ids
}

// TestScenarioList fails if an id of clients/scenarios.json has no test
// here, or a test here names an id the list no longer has.
func TestScenarioList(t *testing.T) {
	ids := scenarioIDs(t)
	if len(ids) < 10 {
		t.Fatalf("the list holds the scenarios: %v", ids)
	}
	for _, id := range ids {
		if scenarios[id] == nil {
			t.Errorf("no test for the scenario %q", id)
		}
	}
	for id := range scenarios {
		if !slices.Contains(ids, id) {
			t.Errorf("a test for %q, which clients/scenarios.json does not list", id)
		}
	}
}

// TestScenarios runs one subtest per scenario, named by its id
// (go test -run 'TestScenarios/release-retried').
func TestScenarios(t *testing.T) {
	for _, id := range scenarioIDs(t) {
		if test := scenarios[id]; test != nil {
			t.Run(id, test)
		}
	}
}

// dial makes a client of addrs, closed when the test ends.
func dial(t *testing.T, addrs []string, opts ...ringlock.Option) *ringlock.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	client, err := ringlock.Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// throughAProxy starts a server, a kit with a proxy to it, and a client
// given the proxy's address; the proxy's id.
func throughAProxy(t *testing.T) (*server, *kit, string, *ringlock.Client) {
	t.Helper()
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	return s, k, proxy, dial(t, []string{address})
}

// testContext bounds a test's requests, so that a client bug fails the test
// instead of hanging it.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, client *ringlock.Client, key string) *ringlock.Lock {
	t.Helper()
	lock, err := client.Acquire(testContext(t), key, lease, ringlock.NoLimit)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return lock
}

func mustRelease(t *testing.T, lock *ringlock.Lock) {
	t.Helper()
	if err := lock.Release(testContext(t)); err != nil {
		t.Fatalf("release %s: %v", lock, err)
	}
}

func cycle(t *testing.T, client *ringlock.Client, key string) {
	t.Helper()
	mustRelease(t, mustAcquire(t, client, key))
}

func oneAddressTwoConnections(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	if _, err := client.Ping(testContext(t)); err != nil {
		t.Fatal(err)
	}
	k.call("wait-open %s 2", proxy)
	if accepted := k.count("accepted %s", proxy); accepted != 2 {
		t.Fatalf("%d connections accepted, want 2", accepted)
	}
}

func roundRobin(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	first, firstAddress := k.start("proxy %s", s.addr)
	second, secondAddress := k.start("proxy %s", s.addr)
	client := dial(t, []string{firstAddress, secondAddress})
	for round := range 8 {
		cycle(t, client, fmt.Sprintf("spread-%d", round))
	}
	k.call("wait-upstream %s - spread-", first)
	k.call("wait-upstream %s - spread-", second)
}

func cutNodeLeftOutAndReconnected(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	first, firstAddress := k.start("proxy %s", s.addr)
	_, secondAddress := k.start("proxy %s", s.addr)
	client := dial(t, []string{firstAddress, secondAddress})
	// Two addresses: one connection to each.
	k.call("wait-open %s 1", first)
	k.call("refuse %s on", first)
	k.call("cut %s", first)
	for round := range 20 {
		cycle(t, client, fmt.Sprintf("left-out-%d", round))
	}
	accepted := k.count("accepted %s", first)
	k.call("refuse %s off", first)
	k.call("wait-accepted %s %d", first, accepted+1)
	k.call("wait-open %s 1", first)
	for round := range 4 {
		cycle(t, client, fmt.Sprintf("back-%d", round))
	}
}

func pipelinedPairingOutOfOrder(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	ctx := testContext(t)
	if _, err := client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	k.call("reorder %s on", proxy)
	locks := make([]*ringlock.Lock, 16)
	errs := make([]error, 16)
	var acquiring sync.WaitGroup
	for index := range locks {
		acquiring.Add(1)
		go func() {
			defer acquiring.Done()
			locks[index], errs[index] = client.Acquire(ctx, fmt.Sprintf("pair-%d", index), lease, ringlock.NoLimit)
		}()
	}
	acquiring.Wait()
	k.call("resume %s", proxy)
	for index, lock := range locks {
		if errs[index] != nil {
			t.Fatalf("pair-%d: %v", index, errs[index])
		}
		if want := fmt.Sprintf("pair-%d", index); lock.Key() != want {
			t.Fatalf("got %s for %s", lock, want)
		}
		// Released only with the token of this key's own grant.
		mustRelease(t, lock)
	}
}

func sameKeyInSendOrder(t *testing.T) {
	s, _, _, client := throughAProxy(t)
	ctx := testContext(t)
	first := mustAcquire(t, client, "same")
	type result struct {
		lock *ringlock.Lock
		err  error
	}
	second := make(chan result, 1)
	go func() {
		lock, err := client.Acquire(ctx, "same", lease, ringlock.NoLimit)
		second <- result{lock, err}
	}()
	// The second acquire is queued behind the first until it is released.
	waitUntil(t, "an acquire of same to be queued", func() bool { return s.stat(t, "waiters") == 1 })
	mustRelease(t, first)
	got := <-second
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.lock.Token() <= first.Token() {
		t.Fatalf("token %d after %d", got.lock.Token(), first.Token())
	}
}

func acquireMovesOnCut(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	ctx := testContext(t)
	if _, err := client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	k.call("wait-open %s 2", proxy)
	k.call("stall %s", proxy)
	type result struct {
		lock *ringlock.Lock
		err  error
	}
	acquired := make(chan result, 1)
	go func() {
		lock, err := client.Acquire(ctx, "moved", lease, ringlock.NoLimit)
		acquired <- result{lock, err}
	}()
	connection := k.call("wait-upstream %s - A moved ", proxy)[0]
	k.call("cut %s %s", proxy, connection)
	k.call("resume %s", proxy)
	got := <-acquired
	if got.err != nil {
		t.Fatal(got.err)
	}
	// Held exactly once: a second acquire with a short wait times out.
	if _, err := client.Acquire(ctx, "moved", lease, 100*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("a second acquire of a held key: %v, want ErrTimeout", err)
	}
	mustRelease(t, got.lock)
}

func noConnectionLeft(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	client := dial(t, []string{address})
	ctx := testContext(t)
	if _, err := client.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A connection still being accepted when refusing starts would be
	// forwarded after the cut.
	k.call("wait-open %s 2", proxy)
	k.call("refuse %s on", proxy)
	k.call("cut %s", proxy)
	k.call("wait-open %s 0", proxy)
	started := time.Now()
	_, err := client.Acquire(ctx, "nowhere", lease, time.Second)
	elapsed := time.Since(started)
	if !errors.Is(err, ringlock.ErrNoConnection) {
		t.Fatalf("acquire with no connection: %v, want ErrNoConnection", err)
	}
	// Generous bounds: only failing at once, or hanging, breaks them.
	if elapsed < 900*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("the acquire waited %v for a connection, want about its wait (1s)", elapsed)
	}
	var connectionError *ringlock.ConnectionError
	if !errors.As(err, &connectionError) || connectionError.Waited > elapsed {
		t.Fatalf("%#v, want a *ConnectionError", err)
	}
	if len(connectionError.Addresses) != 1 || connectionError.Addresses[0].Address != address ||
		!errors.Is(err, io.EOF) {
		t.Errorf("%v: want the proxy's address, closed by the server", err)
	}
	if !strings.HasPrefix(err.Error(), "ringlock: no usable connection after ") ||
		!strings.HasSuffix(err.Error(), address+" (closed by the server)") {
		t.Errorf("%q", err.Error())
	}
}

func restartWithinWait(t *testing.T) {
	s := newServer(t)
	client := dial(t, []string{s.addr})
	before := mustAcquire(t, client, "before")
	s.kill()
	waitUntil(t, "the client to see its connections broken", func() bool {
		return ringlock.UsableConnections(client) == 0
	})
	acquired := make(chan *ringlock.Lock, 1)
	failed := make(chan error, 1)
	go func() {
		lock, err := client.Acquire(testContext(t), "restarted", lease, 20*time.Second)
		if err != nil {
			failed <- err
			return
		}
		acquired <- lock
	}()
	// The acquire waits for a connection; the server comes back within
	// about 100 ms of the kill.
	waitUntil(t, "the acquire to wait for a connection", func() bool {
		return ringlock.RequestsWaitingForConnection(client) == 1
	})
	s.restart(t)
	select {
	case lock := <-acquired:
		if lock.Token() <= before.Token() {
			t.Errorf("token %d after %d, want a new epoch's", lock.Token(), before.Token())
		}
		mustRelease(t, lock)
	case err := <-failed:
		t.Fatalf("the acquire started during the restart failed: %v", err)
	}
}

func shuttingDownRetried(t *testing.T) {
	s := newServer(t)
	holder := newRawConnection(t, s.addr)
	if reply := holder.call(t, "A stopping 60 0"); !strings.HasPrefix(reply, "A ") {
		t.Fatalf("the holder's acquire: %q", reply)
	}
	client := dial(t, []string{s.addr})
	acquired := make(chan *ringlock.Lock, 1)
	failed := make(chan error, 1)
	go func() {
		lock, err := client.Acquire(testContext(t), "stopping", lease, 20*time.Second)
		if err != nil {
			failed <- err
			return
		}
		acquired <- lock
	}()
	waitUntil(t, "the acquire to be queued", func() bool {
		return strings.HasSuffix(holder.call(t, "I stopping"), " 1")
	})
	// The stopping server answers the queued acquire shutting-down, which
	// had no effect: the client sends it again to the next server, within
	// its wait.
	s.terminate(t)
	s.restart(t)
	select {
	case lock := <-acquired:
		mustRelease(t, lock)
	case err := <-failed:
		t.Fatalf("the acquire answered shutting-down failed: %v", err)
	}
}

func connectBackoff(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	proxy, address := k.start("proxy %s", s.addr)
	k.call("refuse %s on", proxy)
	// The proxy accepts and closes at once, so Dial's first connect counts
	// as made; the connection then breaks, again and again.
	dial(t, []string{address}, ringlock.WithConnectionsPerNode(1), ringlock.WithReconnectDelayMax(time.Second))
	k.call("wait-attempts %s 9", proxy)
	assertBackoffShape(t, k.call("attempts %s", proxy))
}

// assertBackoffShape checks the connection attempts an attempts reply lists
// (a count, then milliseconds since the proxy started) against the
// reconnect schedule of the connect-backoff scenario (a cap of 1s): loose
// bounds, on purpose, that only a wrong schedule breaks (a fixed interval,
// or no pause at all); the host is shared and noisy.
func assertBackoffShape(t *testing.T, reply []string) {
	t.Helper()
	var times []float64
	for _, field := range reply[1:] {
		ms, err := strconv.ParseFloat(field, 64)
		if err != nil {
			t.Fatalf("%v: %v", reply, err)
		}
		times = append(times, ms/1000)
	}
	if len(times) < 9 {
		t.Fatalf("%v: want 9 attempts", reply)
	}
	gaps := make([]float64, 8)
	for i := range gaps {
		gaps[i] = times[i+1] - times[i]
	}
	sum := func(values []float64) float64 {
		total := 0.0
		for _, value := range values {
			total += value
		}
		return total
	}
	if gaps[0] >= 0.5 {
		t.Errorf("the first retry goes at once: %v", gaps)
	}
	if sum(gaps[5:])/3 <= 2*sum(gaps[:3])/3 {
		t.Errorf("the gaps grow: %v", gaps)
	}
	if slices.Max(gaps[5:]) < 0.3 {
		t.Errorf("they grow to the cap's order: %v", gaps)
	}
	if slices.Max(gaps) > 2.5 {
		t.Errorf("none beyond the cap: %v", gaps)
	}
}

func releaseRetried(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	ctx := testContext(t)
	lock := mustAcquire(t, client, "retried")
	k.call("stall %s", proxy)
	released := make(chan error, 1)
	go func() { released <- lock.Release(ctx) }()
	// The release is on its way; every connection is cut under it, and the
	// client reconnects at once, within its 5 s of retries.
	k.call("wait-upstream %s - R retried ", proxy)
	k.call("cut %s", proxy)
	k.call("resume %s", proxy)
	if err := <-released; err != nil {
		t.Fatalf("release: %v", err)
	}
	again, err := client.Acquire(ctx, "retried", lease, 100*time.Millisecond)
	if err != nil {
		t.Fatalf("the key is not free at once after the release: %v", err)
	}
	mustRelease(t, again)
}

func redirectFollowed(t *testing.T) {
	s := newServer(t)
	k := newKit(t)
	fake, fakeAddress := k.start("fake %s", s.addr)
	client := dial(t, []string{fakeAddress, s.addr})
	cycle(t, client, "redirected-0")
	redirected := k.count("redirected %s", fake)
	for round := 1; round < 20; round++ {
		cycle(t, client, fmt.Sprintf("redirected-%d", round))
	}
	if now := k.count("redirected %s", fake); now != redirected {
		t.Fatalf("the fake redirected %d requests, then %d: the client should send to the active only",
			redirected, now)
	}
}

func redirectToNoActive(t *testing.T) {
	k := newKit(t)
	_, fakeAddress := k.start("fake -")
	client := dial(t, []string{fakeAddress},
		ringlock.WithReleaseRetry(20*time.Millisecond, 300*time.Millisecond))
	_, err := client.Acquire(testContext(t), "nowhere", lease, 500*time.Millisecond)
	if !errors.Is(err, ringlock.ErrNoActive) {
		t.Fatalf("acquire with no active: %v, want ErrNoActive", err)
	}
}

func timeoutIsNotAGrant(t *testing.T) {
	s := newServer(t)
	holder := dial(t, []string{s.addr})
	other := dial(t, []string{s.addr})
	held := mustAcquire(t, holder, "contended")
	if _, err := other.Acquire(testContext(t), "contended", lease, 200*time.Millisecond); !errors.Is(err, ringlock.ErrTimeout) {
		t.Fatalf("acquire of a held key: %v, want ErrTimeout", err)
	}
	// Still held by the first client: its release finds its grant.
	mustRelease(t, held)
}

func delayedReplies(t *testing.T) {
	_, k, proxy, client := throughAProxy(t)
	k.call("delay %s 300", proxy)
	lock := mustAcquire(t, client, "slow")
	if err := lock.Extend(testContext(t), lease); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, lock)
}

// Secrets of the two names of the authentication scenarios; made for these
// tests only.
const (
	alphaSecret = "alpha-5e0c1b7a9d2f4836"
	betaSecret  = "beta-8a4d2c6e1f0b9357"
)

// authFile is an auth file in a temporary directory of the test's.
type authFile struct {
	path string
}

// newAuthFile writes names (name to secret); each name may lock the keys
// "<name>/*".
func newAuthFile(t *testing.T, names map[string]string) *authFile {
	t.Helper()
	file := &authFile{path: filepath.Join(t.TempDir(), "auth")}
	file.write(t, names)
	return file
}

// write replaces the file in one rename, so that a reload never reads half
// a file.
func (f *authFile) write(t *testing.T, names map[string]string) {
	t.Helper()
	var text strings.Builder
	for name, secret := range names {
		digest := sha256.Sum256([]byte(secret))
		fmt.Fprintf(&text, "%s %s %s/*\n", name, hex.EncodeToString(digest[:]), name)
	}
	draft := f.path + ".draft"
	if err := os.WriteFile(draft, []byte(text.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(draft, f.path); err != nil {
		t.Fatal(err)
	}
}

// authServer starts a server whose auth file names alpha and beta.
func authServer(t *testing.T) (*server, *authFile) {
	t.Helper()
	file := newAuthFile(t, map[string]string{"alpha": alphaSecret, "beta": betaSecret})
	return newServer(t, "--auth-file", file.path), file
}

// assertRefusedSecret checks the error of a call whose client's secret the
// server refused.
func assertRefusedSecret(t *testing.T, err error, address string, elapsed time.Duration) {
	t.Helper()
	var refused *ringlock.AuthError
	if !errors.Is(err, ringlock.ErrAuth) || !errors.As(err, &refused) {
		t.Fatalf("err = %v, want an *AuthError", err)
	}
	if refused.Address != address || refused.Code != ringlock.CodeAuthFailed {
		t.Errorf("refused by %s with %s, want %s and auth-failed", refused.Address, refused.Code, address)
	}
	if elapsed >= 10*time.Second {
		t.Errorf("not a hang: %v", elapsed)
	}
	text := err.Error()
	if !strings.Contains(text, address) || !strings.Contains(text, "auth-failed") {
		t.Errorf("the error names neither the address nor the code: %s", text)
	}
	if strings.Contains(text, alphaSecret) || strings.Contains(text, "not-the-secret") {
		t.Errorf("the error holds a secret: %s", text)
	}
}

func authOK(t *testing.T) {
	s, _ := authServer(t)
	client := dial(t, []string{s.addr}, ringlock.WithSecret(alphaSecret))
	cycle(t, client, "alpha/ok")
	if name := client.Name(); name != "alpha" {
		t.Errorf("Name() = %q, want alpha", name)
	}
}

func authWrong(t *testing.T) {
	s, _ := authServer(t)
	// Dial waits for a first connection, so it is the call that fails.
	started := time.Now()
	client, err := ringlock.Dial(testContext(t), []string{s.addr}, ringlock.WithSecret("not-the-secret"))
	if err == nil {
		client.Close()
		t.Fatal("Dial with a wrong secret succeeded")
	}
	assertRefusedSecret(t, err, s.addr, time.Since(started))
}

func authForbiddenKey(t *testing.T) {
	s, _ := authServer(t)
	client := dial(t, []string{s.addr}, ringlock.WithSecret(alphaSecret))
	_, err := client.Acquire(testContext(t), "beta/theirs", lease, time.Second)
	var refused *ringlock.ServerError
	if !errors.Is(err, ringlock.ErrForbidden) || !errors.As(err, &refused) || refused.Key != "beta/theirs" {
		t.Fatalf("err = %v, want forbidden for beta/theirs", err)
	}
	cycle(t, client, "alpha/mine")
	if usable := ringlock.UsableConnections(client); usable != 2 {
		t.Errorf("%d usable connections, want 2: the forbidden key broke none", usable)
	}
}

func authRevokedOnReload(t *testing.T) {
	s, file := authServer(t)
	alpha := dial(t, []string{s.addr}, ringlock.WithSecret(alphaSecret))
	beta := dial(t, []string{s.addr}, ringlock.WithSecret(betaSecret))
	cycle(t, alpha, "alpha/before")
	cycle(t, beta, "beta/before")
	waitUntil(t, "both of alpha's connections up", func() bool { return ringlock.UsableConnections(alpha) == 2 })
	file.write(t, map[string]string{"beta": betaSecret})
	if err := s.command.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The server closes alpha's connections; the client reconnects, and its
	// secret is refused from then on.
	waitUntil(t, "alpha's connections revoked", func() bool { return ringlock.UsableConnections(alpha) == 0 })
	started := time.Now()
	_, err := alpha.Acquire(testContext(t), "alpha/after", lease, time.Second)
	assertRefusedSecret(t, err, s.addr, time.Since(started))
	cycle(t, beta, "beta/after")
}

func authReconnect(t *testing.T) {
	s, _ := authServer(t)
	client := dial(t, []string{s.addr}, ringlock.WithSecret(alphaSecret))
	cycle(t, client, "alpha/before")
	s.kill()
	waitUntil(t, "the client to see its connections broken", func() bool {
		return ringlock.UsableConnections(client) == 0
	})
	s.restart(t)
	// Granted only if the new connections authenticated: the server answers
	// auth-required to anything else.
	lock, err := client.Acquire(testContext(t), "alpha/after", lease, 5*time.Second)
	if err != nil {
		t.Fatalf("acquire after the restart: %v", err)
	}
	mustRelease(t, lock)
}

func tlsConnect(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, tlsArgs(certs, "server")...)
	client := dial(t, []string{s.addr}, ringlock.WithTLSCA(filepath.Join(certs, "ca.pem")))
	lock, err := client.Acquire(testContext(t), "tls/one", lease, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lock.Extend(testContext(t), 2*lease); err != nil {
		t.Fatal(err)
	}
	mustRelease(t, lock)
	var wg sync.WaitGroup
	failures := make(chan error, 64)
	for index := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lock, err := client.Acquire(testContext(t), fmt.Sprintf("tls/pipelined-%d", index), lease, 5*time.Second)
			if err == nil {
				err = lock.Release(testContext(t))
			}
			if err != nil {
				failures <- err
			}
		}()
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
}

func tlsMTLS(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, append(tlsArgs(certs, "server"), "--tls-client-ca", filepath.Join(certs, "ca.pem"))...)
	ca := ringlock.WithTLSCA(filepath.Join(certs, "ca.pem"))
	withCertificate := dial(t, []string{s.addr}, ca,
		ringlock.WithTLSCert(filepath.Join(certs, "client.pem"), filepath.Join(certs, "client-key.pem")))
	cycle(t, withCertificate, "mtls/with-certificate")
	// TLS 1.3 finishes the client's side of the handshake before the
	// server checks for a certificate, so Dial succeeds and the refusal
	// ends the connection after it.
	without := dial(t, []string{s.addr}, ca)
	started := time.Now()
	_, err := without.Acquire(testContext(t), "mtls/without", lease, time.Second)
	assertTLSFailure(t, err, s.addr, time.Since(started), "certificate required")
}

func tlsWrongCA(t *testing.T) {
	certs := makeCerts(t)
	s := newServer(t, tlsArgs(certs, "server")...)
	r := newRecorder(t, s.addr)
	// Dial waits for a first connection, so it is the call that fails.
	started := time.Now()
	client, err := ringlock.Dial(testContext(t), []string{r.addr}, ringlock.WithTLSCA(filepath.Join(certs, "other-ca.pem")))
	if err == nil {
		client.Close()
		t.Fatal("Dial trusting another CA succeeded")
	}
	assertTLSFailure(t, err, r.addr, time.Since(started), "not trusted")
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("err = %v, want one that wraps an x509.UnknownAuthorityError", err)
	}
	connections := r.connections()
	if len(connections) == 0 {
		t.Fatal("the client did not connect")
	}
	for _, sent := range connections {
		// 0x16: a TLS handshake record (the ClientHello).
		if len(sent) > 0 && sent[0] != 0x16 {
			t.Errorf("a connection began with %q, not a TLS record", sent[:min(len(sent), 20)])
		}
	}
}

// assertTLSFailure checks the error of a call whose connections failed in
// TLS: it matches ErrTLS and ErrNoConnection, names address, says words,
// and reaches the crypto/tls error.
func assertTLSFailure(t *testing.T, err error, address string, elapsed time.Duration, words string) {
	t.Helper()
	var failed *ringlock.TLSError
	if !errors.Is(err, ringlock.ErrTLS) || !errors.As(err, &failed) {
		t.Fatalf("err = %v, want one that matches ErrTLS", err)
	}
	if !errors.Is(err, ringlock.ErrNoConnection) {
		t.Errorf("err = %v, want a *ConnectionError", err)
	}
	if failed.Address != address || failed.Err == nil {
		t.Errorf("TLS failed with %s (%v), want %s and the crypto/tls error", failed.Address, failed.Err, address)
	}
	if elapsed >= 10*time.Second {
		t.Errorf("not a hang: %v", elapsed)
	}
	text := err.Error()
	if !strings.Contains(text, address) || !strings.Contains(text, "TLS") || !strings.Contains(text, words) {
		t.Errorf("the error does not name %s and the TLS failure (%q): %s", address, words, text)
	}
}
